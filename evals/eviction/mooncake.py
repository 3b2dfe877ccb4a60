"""Mooncake (FAST'25) request traces: loading, validation and the policy-free reuse figures.

One JSON object per line: `timestamp` (ms, non-decreasing), `input_length` and `output_length`
(tokens), `hash_ids` (the prompt's 512-token prefix blocks; equal ids at equal prefixes are
reusable KV). The replays key the radix tree by *prefix* ids: block j of a request is identified
by its whole path `hash_ids[:j+1]`, so a hand-written trace that reuses an id under a different
parent is matched as a prefix cache would match it (Mooncake's own ids are chained hashes, for
which this is a one-to-one renaming).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

BLOCK_TOKENS = 512
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    arrival_s: float
    input_length: int
    output_length: int
    blocks: tuple[int, ...]  # prefix ids, one per 512-token prompt block

    def tokens_in(self, n_blocks: int) -> int:
        """Prompt tokens covered by the first `n_blocks` blocks (the last block may be partial)."""
        return min(n_blocks * BLOCK_TOKENS, self.input_length)

    @property
    def footprint_blocks(self) -> int:
        """KV blocks the request holds while it runs: its prompt blocks plus its output's."""
        return max(len(self.blocks), math.ceil((self.input_length + self.output_length) / BLOCK_TOKENS))


@dataclass(frozen=True, slots=True)
class Trace:
    name: str  # the file stem without "_trace", e.g. "conversation"
    requests: tuple[TraceRequest, ...]
    distinct_blocks: int

    @property
    def workload(self) -> str:
        return f"mooncake-{self.name}"

    @property
    def block_lookups(self) -> int:
        return sum(len(r.blocks) for r in self.requests)


def _int_field(obj: dict, key: str, where: str, minimum: int = 0) -> int:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TraceError(f"{where}: field {key!r} must be an integer >= {minimum}, got {value!r}")
    return value


def _parse_line(text: str, where: str) -> tuple[float, int, int, list[int]]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in FIELDS if k not in obj]
    if missing:
        raise TraceError(f"{where}: missing field(s) {', '.join(map(repr, missing))}")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) or ts < 0:
        raise TraceError(f"{where}: field 'timestamp' must be a number of milliseconds >= 0, got {ts!r}")
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or any(isinstance(h, bool) or not isinstance(h, int) for h in ids):
        raise TraceError(f"{where}: field 'hash_ids' must be a list of integers")
    return float(ts), _int_field(obj, "input_length", where), _int_field(obj, "output_length", where), ids


def load_mooncake(path: Path) -> Trace:
    """Parse and validate a trace; raises TraceError naming the first bad line."""
    try:
        lines = Path(path).read_bytes().splitlines()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read trace ({exc.strerror or exc})") from None
    prefix_ids: dict[tuple[int, int], int] = {}  # (parent prefix id, hash id) -> prefix id
    requests: list[TraceRequest] = []
    last_ts = -math.inf
    for number, raw in enumerate(lines, start=1):
        where = f"{path}:{number}"
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            raise TraceError(f"{where}: not UTF-8 text") from None
        if not text.strip():
            continue
        ts, n_in, n_out, ids = _parse_line(text, where)
        if ts < last_ts:
            raise TraceError(
                f"{where}: timestamp {ts:g} ms is before the previous line's {last_ts:g} ms "
                "(the trace must be in non-decreasing timestamp order)"
            )
        last_ts = ts
        blocks, parent = [], -1
        for h in ids:
            parent = prefix_ids.setdefault((parent, h), len(prefix_ids))
            blocks.append(parent)
        requests.append(TraceRequest(ts / 1000.0, n_in, n_out, tuple(blocks)))
    if not requests:
        raise TraceError(f"{path}: the trace has no requests")
    stem = Path(path).stem
    name = stem[: -len("_trace")] if stem.endswith("_trace") and len(stem) > 6 else stem
    return Trace(name, tuple(requests), len(prefix_ids))


@dataclass(frozen=True, slots=True)
class ReuseFigures:
    """Infinite-cache reuse, policy-free: each request reuses its longest prefix that any earlier
    request had (Mooncake's Table 1 method); recomputable from the file alone."""

    prompt_blocks: int
    reused_blocks: int
    prompt_tokens: int
    reused_tokens: int

    @property
    def block_hit_rate(self) -> float:
        return self.reused_blocks / self.prompt_blocks if self.prompt_blocks else 0.0

    @property
    def hit_rate(self) -> float:
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def seen_prefix(blocks: tuple[int, ...], seen: set[int]) -> int:
    """How many leading blocks are in `seen`. Prefix ids make `seen` prefix-closed along a
    request (a block is only ever added with all its ancestors), so binary search finds the end."""
    lo, hi = 0, len(blocks)
    while lo < hi:
        mid = (lo + hi) // 2
        if blocks[mid] in seen:
            lo = mid + 1
        else:
            hi = mid
    return lo


def infinite_reuse(trace: Trace) -> ReuseFigures:
    seen: set[int] = set()
    blocks = reused = tokens = reused_tokens = 0
    for r in trace.requests:
        n = seen_prefix(r.blocks, seen)
        blocks += len(r.blocks)
        reused += n
        tokens += r.input_length
        reused_tokens += r.tokens_in(n)
        seen.update(r.blocks)
    return ReuseFigures(blocks, reused, tokens, reused_tokens)
