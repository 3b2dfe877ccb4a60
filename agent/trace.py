"""Per-model-call trace: `StepRecord`, the JSONL writer, and the session ledger that computes
`ideal_cached_tokens` and detects prefix breaks.

The ledger works on sequences of hashable units: token ids when the agent renders token ids
(or can tokenize), characters otherwise (then token figures are scaled from characters).
"""

from __future__ import annotations

import json
import logging
import threading
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal, TextIO

log = logging.getLogger(__name__)

StepKind = Literal["plan", "act", "tool", "reflect", "backtrack", "fork", "answer", "qa"]


@dataclass(slots=True)
class StepRecord:
    """One model call, exactly the trace fields of DESIGN.md ("Trace")."""

    run_id: str
    session_id: str
    branch: int
    step: int
    kind: str
    prompt_tokens: int
    cached_tokens: int
    ideal_cached_tokens: int
    completion_tokens: int
    ttft_s: float
    latency_s: float
    finish_reason: str
    prefix_break: dict[str, Any] | None
    tool: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False, ensure_ascii=False, default=str)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepRecord:
        names = {f.name for f in fields(cls)}
        missing = names - data.keys()
        if missing:
            raise ValueError(f"trace record lacks {sorted(missing)}")
        return cls(**{k: data[k] for k in names})


class PrefixBreakWarning(UserWarning):
    """A prompt stopped extending its branch's previous prompt without a declared rollback."""


class TraceWriter:
    """Appends one JSON line per step and flushes it at once (a crash loses at most one step)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file: TextIO | None = self.path.open("a", encoding="utf-8")

    def write(self, record: StepRecord) -> None:
        with self._lock:
            if self._file is None:
                raise ValueError(f"trace {self.path} is closed")
            self._file.write(record.to_json() + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def read_trace(path: str | Path) -> list[StepRecord]:
    """Every complete step of a trace. A torn last line (the writer was killed mid-write) is
    skipped with a warning; a bad line anywhere else is corruption and raises ValueError."""
    lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            records.append(StepRecord.from_dict(json.loads(line)))
        except (json.JSONDecodeError, TypeError, KeyError) as exc:
            if number < len(lines):
                raise ValueError(f"{path}:{number}: not a trace record ({exc})") from exc
            warnings.warn(
                f"{path}:{number}: incomplete last line skipped (the run stopped mid-write)", stacklevel=2
            )
    return records


class _Trie:
    """Unit trie of every prompt+output seen in a session (what an unbounded cache would hold)."""

    __slots__ = ("root",)

    def __init__(self) -> None:
        self.root: dict[Any, dict] = {}

    def insert(self, seq: Sequence[Any]) -> None:
        node = self.root
        for unit in seq:
            node = node.setdefault(unit, {})

    def match(self, seq: Sequence[Any]) -> int:
        node, depth = self.root, 0
        for unit in seq:
            nxt = node.get(unit)
            if nxt is None:
                break
            node, depth = nxt, depth + 1
        return depth


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _snippet(seq: Sequence[Any], offset: int, width: int = 24) -> str:
    part = seq[offset : offset + width]
    return part if isinstance(part, str) else " ".join(str(u) for u in part)


class SessionLedger:
    """All prompts and outputs of one session: ideal cache hits and prefix-break checks.

    Thread-safe: fork branches of one session share a ledger.
    """

    def __init__(self, render_units: Any = None) -> None:
        self._lock = threading.Lock()
        self._trie = _Trie()
        self._expected: dict[int, Sequence[Any]] = {}  # branch -> what its next prompt must extend
        # Optional `units -> str` (e.g. backend.decode) to show token snippets as text.
        self._render = render_units
        # Character mode only: (text, its token count as the server reported) for each
        # earlier prompt and prompt+output, to turn a character match into tokens.
        self._anchors: list[tuple[str, int]] = []

    def ideal(self, prompt: Sequence[Any]) -> int:
        """Longest common prefix with any earlier prompt+output of the session.

        Capped at len(prompt) - 1: like SGLang, a cache must recompute the last prompt position.
        """
        with self._lock:
            return min(self._trie.match(prompt), max(len(prompt) - 1, 0))

    def check(self, branch: int, prompt: Sequence[Any]) -> dict[str, Any] | None:
        """The break (offset + snippets) if `prompt` does not extend what its branch expects."""
        with self._lock:
            expected = self._expected.get(branch)
        if expected is None:
            return None
        offset = common_prefix(expected, prompt)
        if offset == len(expected):
            return None
        unit = "chars" if isinstance(prompt, str) else "tokens"
        return {
            "offset": offset,
            "unit": unit,
            "expected": self._text(expected, offset),
            "got": self._text(prompt, offset),
        }

    def record(self, branch: int, prompt: Sequence[Any], output: Sequence[Any]) -> None:
        """Remember prompt+output: the branch's next prompt must extend it."""
        full = prompt + output if type(prompt) is type(output) else list(prompt) + list(output)
        with self._lock:
            self._trie.insert(full)
            self._expected[branch] = full

    def add_anchor(self, text: str, tokens: int) -> None:
        with self._lock:
            self._anchors.append((text, tokens))

    def chars_to_tokens(self, prompt: str, chars: int, prompt_tokens: int) -> int:
        """Tokens in prompt[:chars]: the longest known anchor inside it, plus the rest scaled."""
        base_chars = base_tokens = 0
        with self._lock:
            anchors = list(self._anchors)
        for text, tokens in anchors:
            if base_chars < len(text) <= chars and prompt.startswith(text):
                base_chars, base_tokens = len(text), tokens
        rest = (chars - base_chars) * prompt_tokens / max(len(prompt), 1)
        return min(base_tokens + round(rest), max(prompt_tokens - 1, 0))

    def expect(self, branch: int, prefix: Sequence[Any]) -> None:
        """Declare a rollback or a fork: the branch's next prompt must extend `prefix`."""
        with self._lock:
            self._expected[branch] = prefix

    def _text(self, seq: Sequence[Any], offset: int) -> str:
        if self._render is not None and not isinstance(seq, str):
            try:
                return repr(self._render(list(seq[offset : offset + 24])))
            except Exception:  # a snippet is cosmetic: never let it break a run
                log.debug("snippet decode failed", exc_info=True)
        return repr(_snippet(seq, offset))


def warn_prefix_break(record: StepRecord) -> None:
    brk = record.prefix_break or {}
    message = (
        f"prefix break in session {record.session_id} branch {record.branch} step {record.step}: "
        f"at {brk.get('unit', 'tokens')} offset {brk.get('offset')} expected {brk.get('expected')} "
        f"got {brk.get('got')}"
    )
    log.warning(message)
    warnings.warn(message, PrefixBreakWarning, stacklevel=3)
