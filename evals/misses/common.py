"""What both halves of the eval share: random token sessions, the expected attribution of each
injected cause, and the tally."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

KINDS = ("prompt_change", "eviction", "namespace", "cache_off", "routing")
#: small and fast: a random head, short user turns, two generated tokens
TURN_TOKENS = 4
MAX_NEW = 2
#: token ids drawn from a plain range of the vocabulary (no special tokens)
VOCAB_LOW, VOCAB_HIGH = 1000, 40000


def random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(n)]


def expected_miss(
    kind: str, full: int, prompt: int, cached: int, offset: int | None = None, output: bool = True
) -> dict[str, int]:
    """The exact `miss` of a step injected with `kind` after a session whose previous prompt+output
    has `full` tokens (the step's prompt: `prompt` tokens, extending it unless `kind` edits it).

    The tree holds an earlier prompt+output but its output's last token (sampled, never fed):
    that one position is `last_token` wherever this worker and salt hold the rest (`output`:
    the previous step generated tokens; without, the tree holds all of it).
    """
    added = prompt - full
    last = 1 if output else 0
    if kind == "prompt_change":
        assert offset is not None
        return _nonzero(prompt_change=full - offset, new=added)
    if kind == "eviction":
        return _nonzero(eviction=full - last - cached, last_token=last, new=added)
    if kind == "cache_off":
        return _nonzero(cache_off=full, new=added)
    if kind in ("namespace", "routing"):
        return _nonzero(**{kind: full}, new=added)
    if kind == "control":
        return _nonzero(last_token=last, new=added)
    raise ValueError(f"unknown kind {kind!r}")


def _nonzero(**counts: int) -> dict[str, int]:
    return {k: v for k, v in counts.items() if v}


@dataclass(slots=True)
class Tally:
    """Per kind: injected, found (attribution exact), wrong, and tokens left `unexplained`."""

    rows: dict[str, list[int]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def add(self, kind: str, expected: dict[str, int], got: dict[str, int] | None, note: str = "") -> bool:
        row = self.rows.setdefault(kind, [0, 0, 0, 0])
        row[0] += 1
        got = got or {}
        ok = got == expected
        row[1 if ok else 2] += 1
        row[3] += got.get("unexplained", 0)
        if not ok and len(self.failures) < 20:
            self.failures.append(f"{kind}: expected {expected} got {got} {note}")
        return ok

    def merge(self, other: Tally, prefix: str = "") -> None:
        for kind, row in other.rows.items():
            mine = self.rows.setdefault(prefix + kind, [0, 0, 0, 0])
            for i, v in enumerate(row):
                mine[i] += v
        self.failures += [prefix + f for f in other.failures]

    def to_dict(self) -> dict[str, Any]:
        keys = ("injected", "found", "wrong", "unexplained_tokens")
        return {kind: dict(zip(keys, row, strict=True)) for kind, row in self.rows.items()}
