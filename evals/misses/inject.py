"""Injected causes on the embedded engine: three engines over one set of weights (`sibling`):
`main` (ample pool), `other` (a second worker: routing) and `small` (a pool that fillers push a
session out of: eviction). Each trial runs a two-step session (the second step is a byte-stable
control: only `new` and `last_token` may appear), then injects every cause into a third step,
each checked against a fresh ledger that holds the first two steps."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.accounting import served_from
from evals.misses.common import MAX_NEW, TURN_TOKENS, Tally, expected_miss, random_ids
from runtime.backends.embedded import completion_from_output
from runtime.trace.ledger import Account, SessionLedger, StepAccounting, StepEvent


@dataclass(frozen=True, slots=True)
class Base:
    """The first two steps of a session: (prompt, output) each, all on worker `w0`, no salt."""

    steps: tuple[tuple[list[int], list[int]], ...]

    @property
    def full(self) -> list[int]:
        prompt, out = self.steps[-1]
        return prompt + out


def generate(engine: Any, prompts: list[list[int]], **kw: Any) -> list[Any]:
    """One batched engine call (the engine runs them together); a Completion per prompt."""
    sampling = {"max_new_tokens": MAX_NEW, "temperature": 0.0}
    outs = engine.generate(input_ids=prompts, sampling_params=sampling, **kw)
    return [completion_from_output(out, 0.0) for out in outs]


def account(
    base: Base, ids: list[int], completion: Any, salt: str | None = None, worker: str = "w0"
) -> Account:
    """The injected step through a ledger that holds the base steps (as an SDK client's would)."""
    ledger = SessionLedger()
    for prompt, out in base.steps[:-1]:
        ledger.record(0, prompt, out, None, "w0")
    if ids is not base.steps[-1][0]:
        prompt, out = base.steps[-1]
        ledger.record(0, prompt, out, None, "w0")
    ev = StepEvent(
        branch=0,
        sent=ids,
        sent_output=completion.output_ids,
        units=ids,
        outputs=completion.output_ids,
        served=served_from(completion),
        salt=salt,
        worker=worker,
    )
    return StepAccounting(ledger).observe(ev)


def run_bases(engine: Any, rng: random.Random, n: int, tally: Tally | None) -> list[Base]:
    """n two-step sessions, batched; step 1 extends step 0 byte for byte with ample memory: with
    a `tally`, each is checked as a control (only `new` and `last_token`)."""
    p0 = [random_ids(rng, rng.randrange(8, 25)) + random_ids(rng, TURN_TOKENS) for _ in range(n)]
    c0 = generate(engine, p0)
    p1 = [p + c.output_ids + random_ids(rng, TURN_TOKENS) for p, c in zip(p0, c0, strict=True)]
    c1 = generate(engine, p1)
    bases = []
    for a, ca, b, cb in zip(p0, c0, p1, c1, strict=True):
        base = Base(((a, ca.output_ids), (b, cb.output_ids)))
        bases.append(base)
        if tally is not None:
            got = account(base, b, cb).miss
            tally.add(
                "control",
                expected_miss("control", len(a) + len(ca.output_ids), len(b), cb.cached_tokens),
                got,
            )
    return bases


def _edit(base: Base, rng: random.Random) -> tuple[list[int], int]:
    full = base.full
    offset = rng.randrange(1, len(full) - 1)
    edited = list(full)
    edited[offset] = edited[offset] + 1 if edited[offset] < 40000 else edited[offset] - 1
    return edited + random_ids(rng, TURN_TOKENS), offset


def inject_change(main: Any, bases: list[Base], rng: random.Random, tally: Tally) -> None:
    edits = [_edit(b, rng) for b in bases]
    for base, (ids, offset), c in zip(bases, edits, generate(main, [e[0] for e in edits]), strict=True):
        acc = account(base, ids, c)
        brk = acc.prefix_break or {}
        expected = expected_miss("prompt_change", len(base.full), len(ids), c.cached_tokens, offset)
        if brk.get("offset") != offset:
            expected = {"prefix_break_offset": offset}
        tally.add("prompt_change", expected, acc.miss, f"break {brk.get('offset')}")


def inject_simple(
    engine: Any, bases: list[Base], kind: str, rng: random.Random, tally: Tally, tag: str
) -> None:
    prompts = [b.full + random_ids(rng, TURN_TOKENS) for b in bases]
    salts = [f"tenant-{tag}-{i}" for i in range(len(bases))] if kind == "namespace" else None
    done = generate(engine, prompts, cache_salt=salts, prefix_cache=kind != "cache_off")
    for i, (base, ids, c) in enumerate(zip(bases, prompts, done, strict=True)):
        acc = account(
            base, ids, c, salt=salts[i] if salts else None, worker="w1" if kind == "routing" else "w0"
        )
        tally.add(kind, expected_miss(kind, len(base.full), len(ids), c.cached_tokens), acc.miss)


def inject_eviction(small: Any, n: int, rng: random.Random, tally: Tally) -> None:
    """n sessions fill the small pool; fillers of another tenant push some or all of each out."""
    bases = run_bases(small, rng, n, None)
    fillers = [random_ids(rng, rng.randrange(200, 300)) for _ in range(2)]
    small.generate(input_ids=fillers, sampling_params={"max_new_tokens": 1}, cache_salt="filler")
    prompts = [b.full + random_ids(rng, TURN_TOKENS) for b in bases]
    for base, ids, c in zip(bases, prompts, generate(small, prompts), strict=True):
        acc = account(base, ids, c)
        held = len(base.full) - 1
        kind = "eviction" if c.cached_tokens < held else "eviction (none happened)"
        tally.add(
            kind,
            expected_miss("eviction", len(base.full), len(ids), c.cached_tokens),
            acc.miss,
            f"cached {c.cached_tokens} of {held}",
        )


def run(
    engines: dict[str, Any], trials: int, seed: int, progress: Callable[[int], None] | None = None
) -> Tally:
    """`engines`: main, other, small. Every session gets each kind injected once (plus one
    control), in batches of `CHUNK` sessions (the main engine is flushed between batches, so
    memory stays ample there)."""
    rng = random.Random(seed)
    tally = Tally()
    done = 0
    while done < trials:
        n = min(CHUNK, trials - done)
        for engine in engines.values():
            engine.flush_cache()
        bases = run_bases(engines["main"], rng, n, tally)
        inject_change(engines["main"], bases, rng, tally)
        inject_simple(engines["main"], bases, "namespace", rng, tally, str(done))
        inject_simple(engines["main"], bases, "cache_off", rng, tally, str(done))
        inject_simple(engines["other"], bases, "routing", rng, tally, str(done))
        inject_eviction(engines["small"], n, rng, tally)
        done += n
        if progress is not None:
            progress(done)
    return tally


#: sessions per batch: the main pool holds a batch's every prompt with room to spare
CHUNK = 25
SMALL_POOL = 640


def build_engines(pool: int = 8192) -> dict[str, Any]:
    from runtime import Engine

    main = Engine(max_total_tokens=pool)
    return {
        "main": main,
        "other": main.sibling(max_total_tokens=pool),
        "small": main.sibling(max_total_tokens=SMALL_POOL),
    }
