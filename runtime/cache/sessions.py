"""What the cache knows about agent sessions: who is live, who waits on a tool and until when,
which branches were abandoned.

Mutations: every method that takes a session id may change that session's state; `on_event`
with "abandon" also marks tree nodes (a side table keyed by node id, so it works on trees whose
nodes have no `sessions` field, such as SGLang's) and may split one node at the checkpoint.
Reads (`gap`, `is_abandoned`) never mutate and are what `SessionPolicy.get_priority` calls.
The engine calls everything under its lock; the registry itself is not thread-safe.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.errors import InvalidRequest, UnknownSession

if TYPE_CHECKING:
    from runtime.cache.radix import RadixCache

EVENTS = ("open", "tool_wait", "resume", "abandon", "close")


@dataclass(slots=True)
class SessionState:
    """One open session. `deadline` is set only while it waits on a tool with an expected return."""

    session_id: str
    last_activity: float
    in_flight: int = 0
    waiting: bool = False
    deadline: float | None = None
    resumed: bool = False  # the tool returned: the next request is imminent
    wait_started: float | None = None
    hint: float | None = None  # expected_s of the current tool wait
    tool: str = ""  # name of the tool being waited on ("" if not given)
    abandoned_nodes: list[int] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.in_flight or self.resumed:
            return "live"
        return "waiting" if self.waiting else "idle"


class ResidualModel:
    """Mean residual life E[X - e | X > e] from the latest observed samples of X.

    The sorted view is rebuilt lazily, at most once per `refresh` new samples (eviction reads it
    for every candidate leaf, so it must stay cheap).
    """

    def __init__(self, capacity: int = 1024, min_samples: int = 16, refresh: int = 32) -> None:
        self._samples: deque[float] = deque(maxlen=capacity)
        self.min_samples = min_samples
        self.refresh = refresh
        self._pending = 0
        self._sorted: list[float] = []
        self._suffix: list[float] = [0.0]

    def add(self, x: float) -> None:
        self._samples.append(x)
        self._pending += 1
        if len(self._sorted) < self.min_samples * 4 or self._pending >= self.refresh:
            self._rebuild()

    def _rebuild(self) -> None:
        self._pending = 0
        self._sorted = sorted(self._samples)
        acc, self._suffix = 0.0, [0.0] * (len(self._sorted) + 1)
        for i in range(len(self._sorted) - 1, -1, -1):
            acc += self._sorted[i]
            self._suffix[i] = acc

    def residual(self, elapsed: float) -> float | None:
        """None while there are too few samples or none ran longer than `elapsed`."""
        found = self.estimate(elapsed)
        return None if found is None else found[0]

    def estimate(self, elapsed: float) -> tuple[float, int] | None:
        """(mean residual life at `elapsed`, how many samples it rests on: those longer than
        `elapsed`), or None like `residual`. Past the bulk of the samples the support is a handful
        of waits, and the estimate is only as good as they are."""
        ordered = self._sorted
        n = len(ordered)
        if n < self.min_samples:
            return None
        i = bisect.bisect_right(ordered, elapsed)
        return None if i == n else (self._suffix[i] / (n - i) - elapsed, n - i)


class SessionRegistry:
    """Open sessions by id. A closed session is forgotten: nodes that only it used become dead."""

    #: sessions opened between sweeps for idle ones; tool names with a wait model of their own
    SWEEP_EVERY, MAX_TOOLS = 256, 256

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        prior_weight: float = 16.0,
        idle_timeout_s: float = 3600.0,
    ) -> None:
        if prior_weight < 0 or idle_timeout_s <= 0:
            raise ValueError("prior_weight must be >= 0 and idle_timeout_s > 0")
        #: a session silent this long with nothing in flight is closed (clients that never send
        #: `close` must not grow the registry forever); its next request reopens it
        self.idle_timeout_s = idle_timeout_s
        self._opened_since_sweep = 0
        self.clock = clock
        #: credibility of the no-model guess (TTL left, else recency), in samples: a learned
        #: estimate resting on n past waits gets weight n / (n + prior_weight)
        self.prior_weight = prior_weight
        self._states: dict[str, SessionState] = {}
        self._abandoned: dict[int, set[str]] = {}  # node id -> sessions that abandoned it
        #: learned from finished tool waits: durations without a hint, actual/expected ratios with one
        self.waits: dict[str, ResidualModel] = {}  # per tool name ("" = any)
        self.hint_ratios = ResidualModel()

    # ---- requests -----------------------------------------------------------------------
    def on_request(self, session_id: str) -> SessionState:
        """A request of this session starts (opens an unknown session)."""
        state = self._states.get(session_id) or self._open(session_id)
        self._end_wait(state)
        state.in_flight += 1
        state.waiting, state.deadline, state.resumed = False, None, False
        state.last_activity = self.clock()
        return state

    def on_request_done(self, session_id: str) -> None:
        state = self._states.get(session_id)
        if state is None:  # closed while its request ran
            return
        state.in_flight = max(0, state.in_flight - 1)
        state.last_activity = self.clock()

    # ---- events -------------------------------------------------------------------------
    def on_event(
        self,
        session_id: str,
        event: str,
        cache: RadixCache | None = None,
        namespace: str = "",
        **info: Any,
    ) -> None:
        """Apply a session event. Raises UnknownSession for events on a session never opened."""
        if event not in EVENTS:
            raise InvalidRequest(f"unknown session event {event!r}; choose from {list(EVENTS)}")
        if event == "open":
            self._states.get(session_id) or self._open(session_id)
            return
        state = self._states.get(session_id)
        if state is None:
            raise UnknownSession(f"session {session_id!r} is not open")
        now = self.clock()
        if event == "tool_wait":
            expected = info.get("expected_s")
            state.waiting, state.resumed, state.last_activity = True, False, now
            state.hint = None if expected is None else max(0.0, float(expected))
            state.deadline = None if state.hint is None else now + state.hint
            state.wait_started, state.tool = now, str(info.get("tool") or "")
        elif event == "resume":
            self._end_wait(state)
            state.waiting, state.deadline, state.resumed = False, None, True
            state.last_activity = now
        elif event == "abandon":
            self._abandon(state, cache, namespace, info.get("input_ids") or (), int(info.get("keep", 0)))
        else:  # close
            self._close(state)

    def _open(self, session_id: str) -> SessionState:
        now = self.clock()
        self._opened_since_sweep += 1
        if self._opened_since_sweep >= self.SWEEP_EVERY:
            self.expire_idle(now)
        state = SessionState(session_id=session_id, last_activity=now)
        self._states[session_id] = state
        return state

    def expire_idle(self, now: float) -> int:
        """Close sessions idle past `idle_timeout_s` (nothing in flight, no tool deadline ahead)."""
        self._opened_since_sweep = 0
        stale = [
            s
            for s in self._states.values()
            if not s.in_flight
            and now - s.last_activity > self.idle_timeout_s
            and (s.deadline is None or s.deadline < now)
        ]
        for state in stale:
            self._close(state)
        return len(stale)

    def _end_wait(self, state: SessionState) -> None:
        if state.wait_started is None:
            return
        took = self.clock() - state.wait_started
        if state.hint:
            self.hint_ratios.add(took / state.hint)
        if state.hint is None or state.tool:
            for name in {state.tool, ""}:
                if (
                    not name or name in self.waits or len(self.waits) < self.MAX_TOOLS
                ):  # client names: bounded
                    self.waits.setdefault(name, ResidualModel()).add(took)
        state.wait_started = state.hint = None

    def _close(self, state: SessionState) -> None:
        for node_id in state.abandoned_nodes:
            marks = self._abandoned.get(node_id)
            if marks is not None:
                marks.discard(state.session_id)
                if not marks:
                    del self._abandoned[node_id]
        del self._states[state.session_id]

    def _abandon(
        self, state: SessionState, cache: RadixCache | None, namespace: str, ids: Sequence[int], keep: int
    ) -> None:
        """Mark the nodes of `ids` past the first `keep` tokens as dead for this session."""
        if cache is None or len(ids) <= keep:
            return
        sid = state.session_id
        for node, start in cache.path_nodes(ids, namespace, split_at=keep):
            if start >= keep:
                self._abandoned.setdefault(node.id, set()).add(sid)
                state.abandoned_nodes.append(node.id)

    def _residual_wait(self, tool: str, elapsed: float) -> tuple[float, int] | None:
        model = self.waits.get(tool)
        found = model.estimate(elapsed) if model is not None else None
        if found is None and tool:
            model = self.waits.get("")
            found = model.estimate(elapsed) if model is not None else None
        return found

    # ---- reads (the eviction policy) ----------------------------------------------------
    def get(self, session_id: str) -> SessionState | None:
        return self._states.get(session_id)

    def is_open(self, session_id: str) -> bool:
        return session_id in self._states

    def __len__(self) -> int:
        return len(self._states)

    def counts(self) -> dict[str, int]:
        """Open sessions, and how many of them wait on a tool (metrics)."""
        waiting = sum(1 for s in self._states.values() if s.status == "waiting")
        return {"sessions_open": len(self._states), "sessions_waiting_on_tool": waiting}

    def abandoned_by(self, node_id: int) -> set[str] | None:
        return self._abandoned.get(node_id)

    def gap(self, session_id: str, now: float) -> float | None:
        """Estimated seconds until this session next reads the cache; None if it is not open.

        In flight or resumed: 0. Idle: the time since its last activity, which makes idle
        sessions order exactly by recency. Waiting on a tool: start from the guess that needs no
        learning, the prior: the time left to the hint's deadline while it lies ahead (a
        time-to-live), else the time since its last activity (recency, as when idle). Then blend
        in what past waits taught, each estimate of the expected time left given how long this
        wait has lasted (from how long hinted waits really took relative to their hint, and how
        long waits on this tool took) weighted by credibility: an estimate resting on n past
        waits that ran longer than this one counts n / (n + prior_weight), the prior the rest.
        Without that weighting a wait that has outlasted nearly every past wait would be judged
        by the one or two longer ones and look about to return (a mean residual life read off
        a sparse tail); on plain chat think times this reordered idle sessions against recency
        and lost to LRU.
        """
        state = self._states.get(session_id)
        if state is None:
            return None
        if state.in_flight or state.resumed:
            return 0.0
        if not state.waiting or state.wait_started is None:
            return max(0.0, now - state.last_activity)
        deadline = state.deadline
        prior = (
            deadline - now if deadline is not None and deadline > now else max(0.0, now - state.last_activity)
        )
        elapsed, k = now - state.wait_started, self.prior_weight
        if state.hint:
            ratio = self.hint_ratios.estimate(elapsed / state.hint)
            if ratio is None:
                return prior
            left, n = ratio
            gap = (n * left * state.hint + k * prior) / (n + k)
            tool = self._residual_wait(state.tool, elapsed) if state.tool else None
            if tool is None:
                return gap
            left, n = tool
            return (gap + (n * left + k * prior) / (n + k)) / 2
        if state.hint is None:
            tool = self._residual_wait(state.tool, elapsed)
            if tool is not None:
                left, n = tool
                return (n * left + k * prior) / (n + k)
        return prior
