"""The trace's session ledger: ideal cache hits, prefix breaks and miss attribution.

One implementation for the agent SDK (agent/trace.py re-exports it) and for `serve --trace-dir`
(runtime/server/trace_dir.py). A ledger holds every prompt+output a session sent or produced,
keyed by the cache salt and the worker that served it, and answers per step:

- `ideal_cached_tokens`: the longest common prefix with any earlier prompt+output (capped at
  len-1, as an engine never matches the last prompt token);
- `prefix_break`: where a prompt stopped extending its branch's previous prompt+output;
- `miss`: every uncached prompt token by cause (`attribute`), summing to prompt - cached.

Units are hashable items: token ids, or characters when the client cannot tokenize (then
token figures are scaled from characters through anchors of known token counts).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TypedDict, cast

log = logging.getLogger(__name__)

#: every cause of a `miss` object, in the order reports show them
MISS_CAUSES = (
    "new",
    "prompt_change",
    "template_rewrite",
    "eviction",
    "eviction_inferred",
    "namespace",
    "cache_off",
    "routing",
    "last_token",
    "granularity",
    "unexplained",
)


class ChangedSpan(TypedDict):
    """The span of a prompt that differs from its reference, and how much matches after it."""

    expected: str
    got: str
    resumes: int
    realigned: int


class RewriteNote(TypedDict):
    """An assistant turn the chat template did not render as generated (what it dropped)."""

    message: int
    dropped: str


class PrefixBreak(TypedDict, total=False):
    """The trace's `prefix_break` object (DESIGN.md "Trace"). Every key is optional to a
    reader: traces written by older versions lack some of them."""

    offset: int
    unit: str  # "tokens" | "chars"
    expected: str
    got: str
    reference: str  # "branch" | "session"
    changed: ChangedSpan
    piece: str  # the prompt piece the break falls in (agent SDK)
    cause: str
    rewrites: list[RewriteNote]


_Node = dict[Hashable, "_Node"]


class _Trie:
    """Unit trie of every prompt+output seen (what an unbounded cache would hold)."""

    __slots__ = ("root",)

    def __init__(self) -> None:
        self.root: _Node = {}

    def insert(self, seq: Sequence[Hashable]) -> None:
        node = self.root
        for unit in seq:
            node = node.setdefault(unit, {})

    def match(self, seq: Sequence[Hashable]) -> int:
        node, depth = self.root, 0
        for unit in seq:
            nxt = node.get(unit)
            if nxt is None:
                break
            node, depth = nxt, depth + 1
        return depth


def common_prefix(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _snippet(seq: Sequence[Hashable], offset: int, width: int = 24) -> str:
    part = seq[offset : offset + width]
    return part if isinstance(part, str) else " ".join(str(u) for u in part)


#: units a changed span must be followed by, matching the reference again, to count as a change
#: (not new text): a chat turn's close alone (~5 tokens) never realigns a new question
REALIGN_MIN = 16
#: how far past the break the realignment is searched (units of the prompt)
REALIGN_SCAN = 8192


@dataclass(frozen=True, slots=True)
class Change:
    """A changed span: prompt[offset:resumes] replaced reference[offset:ref_resumes], after
    which `realigned` units equal the reference again (what the change cost the cache)."""

    offset: int
    resumes: int
    ref_resumes: int
    realigned: int

    @property
    def end(self) -> int:
        return self.resumes + self.realigned


def realign(reference: Sequence[Hashable], prompt: Sequence[Hashable], offset: int) -> Change | None:
    """Where `prompt`, diverging from `reference` at `offset`, matches it again for at least
    REALIGN_MIN units (the first such place), or None: everything past the break is new."""
    w = REALIGN_MIN
    if len(prompt) - offset < w or len(reference) - offset < w:
        return None
    first: dict[Hashable, int] = {}
    for j in range(len(reference) - w, offset - 1, -1):  # the earliest position wins
        first[_window(reference, j, w)] = j
    for i in range(offset, min(len(prompt) - w, offset + REALIGN_SCAN) + 1):
        found = first.get(_window(prompt, i, w))
        if found is not None:
            run = common_prefix(reference[found:], prompt[i:])
            return Change(offset, i, found, run)
    return None


#: a changed span is shown up to this many units
SPAN_MAX = 64


def _costly(change: Change, prompt: Sequence[Hashable]) -> bool:
    """A change against the session's last prompt counts when what realigns after it is long
    (a whole document or tool list) and longer than the span itself: a new task followed by
    the same short instruction is new text, not a change."""
    floor = REALIGN_MIN * (16 if isinstance(prompt, str) else 4)
    return change.realigned >= max(floor, change.resumes - change.offset)


def _window(seq: Sequence[Hashable], at: int, width: int) -> Hashable:
    part = seq[at : at + width]
    return part if isinstance(part, str) else tuple(part)


def _extend(prompt: Sequence[Hashable], output: Sequence[Hashable]) -> Sequence[Hashable]:
    """prompt+output: a str, list or tuple prompt extends with its own type; anything else
    becomes a list."""
    if isinstance(prompt, str) and isinstance(output, str):
        return prompt + output
    if isinstance(prompt, list) and isinstance(output, list):
        return prompt + output
    if isinstance(prompt, tuple) and isinstance(output, tuple):
        return prompt + output
    return list(prompt) + list(output)


@dataclass(frozen=True, slots=True)
class Matches:
    """Uncapped matches of one prompt against a ledger, in the prompt's units."""

    any: int  # any earlier prompt+output of the session
    salt: int  # ... sent under this request's salt
    worker: int  # ... under this salt, served by this request's worker
    #: the worker match ends where an earlier output ended: an engine never computes the KV of
    #: an output's last token (it is sampled, not fed), so that one position is never cached
    at_output_end: bool = False


@dataclass(frozen=True, slots=True)
class Served:
    """What the serving side said about one request (meta_info / usage)."""

    prompt_tokens: int
    cached_tokens: int
    #: engine-confirmed prompt tokens after `cached_tokens` it held and evicted; None: unknown
    #: (a server without the record: the gap is then reported as `eviction_inferred`)
    evicted_tokens: int | None = None
    cache_off: bool = False  # prefix_cache=false, or a server without a radix cache
    page_size: int = 1  # the engine matches whole pages only


def attribute(served: Served, m: Matches, expected: int | None) -> dict[str, int]:
    """Every uncached prompt token of one step by cause; values sum to prompt - cached.

    `m` is in tokens. Positions [cached, P) split at the worker / salt / any-match boundaries:
    below the worker's match the engine lost what it held (cache off, pages, eviction), then
    what another worker holds (routing), then what another salt holds (namespace); past every
    match the prompt itself is new, except what extending the branch's `expected` tokens (set
    when this prompt broke its branch) would have served (prompt_change). `last_token`: the
    last prompt token when the whole prompt was seen before (no engine matches it), and the
    last token of an earlier output where the match ends there (its KV is never computed).
    """
    p, c = served.prompt_tokens, served.cached_tokens
    cap = max(p - 1, c, 0)
    worker = max(c, min(m.worker, cap))
    salt = max(worker, min(m.salt, cap))
    seen = max(salt, min(m.any, cap))
    miss: dict[str, int] = {}
    _engine_side(miss, served, m, worker)
    miss["routing"] = salt - worker
    miss["namespace"] = seen - salt
    rest = p - seen
    whole = 1 if m.any >= p and rest == 1 else 0
    miss["last_token"] = miss.get("last_token", 0) + whole
    change = 0 if expected is None else max(0, min(expected, cap) - seen)
    miss["prompt_change"] = min(change, rest - whole)
    miss["new"] = rest - whole - miss["prompt_change"]
    return {k: miss[k] for k in MISS_CAUSES if miss.get(k)}


def _engine_side(miss: dict[str, int], served: Served, m: Matches, worker: int) -> None:
    gap = worker - served.cached_tokens
    if gap <= 0:
        return
    if served.cache_off:
        miss["cache_off"] = gap
        return
    if m.at_output_end and m.worker == worker:  # the previous output's last token
        miss["last_token"] = 1
        gap -= 1
    page = max(served.page_size, 1)
    miss["granularity"] = min(gap, worker % page) if page > 1 else 0
    gap -= miss["granularity"]
    if served.evicted_tokens is None:
        miss["eviction_inferred"] = gap
        return
    miss["eviction"] = min(max(served.evicted_tokens, 0), gap)
    miss["unexplained"] = gap - miss["eviction"]


Key = tuple[str | None, str | None]  # (cache salt, worker)


class SessionLedger:
    """All prompts and outputs of one session: ideal cache hits and prefix-break checks.

    Thread-safe: fork branches of one session share a ledger.
    """

    def __init__(self, render_units: Callable[[list[int]], str] | None = None) -> None:
        self._lock = threading.Lock()
        self._tries: dict[Key, _Trie] = {}  # one per (salt, worker): a cache holds one of them
        # (length, hash) of each prompt+output whose output is not empty, per key (at_output_end)
        self._ends: dict[Key, set[tuple[int, int]]] = {}
        self._expected: dict[int, Sequence[Hashable]] = {}  # branch -> what its next prompt must extend
        # Optional `units -> str` (e.g. backend.decode) to show token snippets as text.
        self._render = render_units
        # Character mode only: (text, its token count as the server reported) for each
        # earlier prompt and prompt+output, to turn a character match into tokens.
        self._anchors: list[tuple[str, int]] = []
        self._last: Sequence[Hashable] = ()  # the latest prompt+output recorded on any branch

    @property
    def render_units(self) -> Callable[[list[int]], str] | None:
        return self._render

    def matches(
        self, prompt: Sequence[Hashable], salt: str | None = None, worker: str | None = None
    ) -> Matches:
        """Uncapped longest prefixes of `prompt` over everything / this salt / this salt and worker."""
        with self._lock:
            by_key = {key: trie.match(prompt) for key, trie in self._tries.items()}
            ends = self._ends.get((salt, worker), set())
        same_salt = [n for (s, _), n in by_key.items() if s == salt]
        on_worker = by_key.get((salt, worker), 0)
        at_end = bool(ends) and (on_worker, hash(tuple(prompt[:on_worker]))) in ends
        return Matches(
            any=max(by_key.values(), default=0),
            salt=max(same_salt, default=0),
            worker=on_worker,
            at_output_end=at_end and not isinstance(prompt, str),
        )

    def ideal(self, prompt: Sequence[Hashable]) -> int:
        """Longest common prefix with any earlier prompt+output of the session.

        Capped at len(prompt) - 1: like SGLang, a cache must recompute the last prompt position.
        """
        return min(self.matches(prompt).any, max(len(prompt) - 1, 0))

    def check(self, branch: int, prompt: Sequence[Hashable]) -> PrefixBreak | None:
        """The break (offset + snippets) if `prompt` does not extend what its branch expects.

        A branch with nothing to extend yet (a new run of the session) is checked against the
        session's last prompt+output, whichever run, request or door sent it: there a break is
        reported only where the prompt matches that reference again after a changed span (a
        changed system line before an unchanged document), as a new task is not a break. The
        break carries `reference` ("branch" | "session") and, where found, `changed`: the span
        that differs and how many units after it equal the reference again.
        """
        with self._lock:
            expected = self._expected.get(branch)
            last = self._last
        if expected is None:
            return None
        reference, kind = (expected, "branch") if len(expected) or not len(last) else (last, "session")
        offset = common_prefix(reference, prompt)
        if offset == len(reference):
            return None
        change = realign(reference, prompt, offset)
        if kind == "session" and (change is None or not _costly(change, prompt)):
            return None
        unit = "chars" if isinstance(prompt, str) else "tokens"
        out: PrefixBreak = {
            "offset": offset,
            "unit": unit,
            "expected": self._text(reference, offset),
            "got": self._text(prompt, offset),
            "reference": kind,
        }
        if change is not None:
            out["changed"] = {
                "expected": self._span(reference, offset, change.ref_resumes),
                "got": self._span(prompt, offset, change.resumes),
                "resumes": change.resumes,
                "realigned": change.realigned,
            }
        return out

    def expected(self, branch: int) -> Sequence[Hashable] | None:
        """What the branch's next prompt must extend (None: nothing yet)."""
        with self._lock:
            return self._expected.get(branch)

    def record(
        self,
        branch: int,
        prompt: Sequence[Hashable],
        output: Sequence[Hashable],
        salt: str | None = None,
        worker: str | None = None,
    ) -> None:
        """Remember prompt+output: the branch's next prompt must extend it."""
        full = _extend(prompt, output)
        with self._lock:
            self._tries.setdefault((salt, worker), _Trie()).insert(full)
            if len(output) and not isinstance(full, str):
                self._ends.setdefault((salt, worker), set()).add((len(full), hash(tuple(full))))
            self._expected[branch] = full
            self._last = full

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

    def expect(self, branch: int, prefix: Sequence[Hashable]) -> None:
        """Declare a rollback or a fork: the branch's next prompt must extend `prefix`."""
        with self._lock:
            self._expected[branch] = prefix

    def _text(self, seq: Sequence[Hashable], offset: int, width: int = 24) -> str:
        if self._render is not None and not isinstance(seq, str):
            try:
                # a render is only given where units are token ids
                return repr(self._render(cast(list[int], list(seq[offset : offset + width]))))
            except Exception:  # a snippet is cosmetic: never let it break a run
                log.debug("snippet decode failed", exc_info=True)
        return repr(_snippet(seq, offset, width))

    def _span(self, seq: Sequence[Hashable], start: int, end: int) -> str:
        """seq[start:end] as a snippet, at most SPAN_MAX units (then marked as cut)."""
        text = self._text(seq, start, min(end - start, SPAN_MAX))
        return text + (f" (+{end - start - SPAN_MAX} more)" if end - start > SPAN_MAX else "")


@dataclass(frozen=True, slots=True)
class StepEvent:
    """One model call as the ledger sees it. `sent` is what went to the server (token ids, or
    text); `units` the same prompt in the ideal ledger's units (token ids when the client can
    tokenize, else `sent` itself), `outputs` the output in those units."""

    branch: int
    sent: Sequence[Hashable]
    sent_output: Sequence[Hashable]
    units: Sequence[Hashable]
    outputs: Sequence[Hashable]
    served: Served
    completion_tokens: int = 0
    salt: str | None = None
    worker: str | None = None
    #: character mode: text that follows the output in the next prompt (the turn's close)
    output_tail: str = ""
    #: assistant turns the chat template did not render as generated, each {"message": index,
    #: "dropped": text} (runtime/server/reasoning_history.py): a break they explain is counted
    #: as `template_rewrite`, not `prompt_change`
    rewrites: tuple[RewriteNote, ...] = ()


@dataclass(frozen=True, slots=True)
class Account:
    ideal_cached_tokens: int
    prefix_break: PrefixBreak | None
    miss: dict[str, int]


class StepAccounting:
    """The trace's observer: fed each step in order, it checks the prompt against its branch,
    computes the ideal hit and the miss causes, then remembers prompt+output.

    `breaks` works on what is sent, `ideal` (default: the same ledger) on token ids.
    """

    def __init__(self, breaks: SessionLedger, ideal: SessionLedger | None = None) -> None:
        self.breaks = breaks
        self.ideal = ideal if ideal is not None else breaks

    def observe(self, ev: StepEvent) -> Account:
        brk = self.breaks.check(ev.branch, ev.sent)
        expected = self._expected(ev, brk)
        m = self.ideal.matches(ev.units, ev.salt, ev.worker)
        p = ev.served.prompt_tokens
        if isinstance(ev.units, str):  # characters (no tokenizer): convert to the server's tokens
            m, expected = self._chars_to_tokens(ev, m, expected)
        miss = attribute(ev.served, m, None if expected is None else len(expected))
        if brk is not None and ev.rewrites:
            miss, brk = _template_rewrite(miss, brk, ev.rewrites)
        ideal = min(m.any, max(p - 1, 0))
        self._remember(ev)
        return Account(max(ideal, 0), brk, miss)

    def _expected(self, ev: StepEvent, brk: PrefixBreak | None) -> Sequence[Hashable] | None:
        """What extending the reference would have served, in the ideal ledger's units: the
        branch's expectation, or (against the session's last prompt) up to the realigned end."""
        if brk is None:
            return None
        if brk.get("reference") != "session":
            return self.ideal.expected(ev.branch)
        changed = brk["changed"]
        end = changed["resumes"] + changed["realigned"]
        return range(round(end * len(ev.units) / max(len(ev.sent), 1)))

    def _chars_to_tokens(
        self, ev: StepEvent, m: Matches, expected: Sequence[Hashable] | None
    ) -> tuple[Matches, Sequence[Hashable] | None]:
        text, p = str(ev.units), ev.served.prompt_tokens
        conv = self.ideal.chars_to_tokens

        def tokens(chars: int) -> int:  # a whole-prompt match stays whole (last_token)
            return p if chars >= len(text) else conv(text, chars, p)

        out = Matches(tokens(m.any), tokens(m.salt), tokens(m.worker))
        if expected is not None:  # scaled: only its length matters
            expected = range(round(len(expected) * p / max(len(text), 1)))
        return out, expected

    def _remember(self, ev: StepEvent) -> None:
        self.breaks.record(ev.branch, ev.sent, ev.sent_output, ev.salt, ev.worker)
        if isinstance(ev.units, str):
            p = ev.served.prompt_tokens
            self.ideal.add_anchor(ev.units, p)
            self.ideal.add_anchor(ev.units + str(ev.outputs) + ev.output_tail, p + ev.completion_tokens)
        if self.ideal is not self.breaks:
            self.ideal.record(ev.branch, ev.units, ev.outputs, ev.salt, ev.worker)


def _template_rewrite(
    miss: dict[str, int], brk: PrefixBreak, rewrites: tuple[RewriteNote, ...]
) -> tuple[dict[str, int], PrefixBreak]:
    """The break was the chat template re-rendering earlier assistant turns otherwise than they
    were generated: what extending the previous prompt would have served counts as
    `template_rewrite` (same total), and the break names the turns and what was dropped."""
    out = dict(miss)
    moved = out.pop("prompt_change", 0)
    if moved:
        out["template_rewrite"] = moved
    ordered = {k: out[k] for k in MISS_CAUSES if out.get(k)}
    return ordered, {**brk, "cause": "template_rewrite", "rewrites": list(rewrites)}
