"""Keeps a `Cluster` serving when one of its processes dies (`radixagent cluster` runs this).

A worker that exits (a crash, the OOM killer, SIGKILL) is taken out of the router's rotation at
once (removed from its worker list, rather than waiting for its health checks), then restarted
with backoff on a fresh port and registered with the router as a new worker once it answers
/health. A new URL, not the old one: the router pins each routing key to its first worker and
falls back to a second one while the first is unhealthy, so a worker coming back under its old
URL would pull its sessions back from the survivor that has meanwhile cached them (a second
recompute); under a new URL the moved sessions stay where they are and new sessions fill the
restarted worker. Restarts are bounded (`RestartPolicy`): a process that keeps crashing is left
down and logged, and the cluster keeps serving with the others. The router, if it dies, is
restarted on its own port with the workers that are up.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from runtime.cluster.cluster import Cluster, Proc, _signal_group


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    #: restarts of one process allowed within `window_s`; beyond that it stays down (0: never restart)
    max_restarts: int = 5
    window_s: float = 600.0
    #: delay before the first restart; doubled for each further restart within the window
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    #: a restarted worker that does not answer /health within this long is killed and counts as a crash
    startup_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0 or self.window_s <= 0 or self.backoff_s < 0 or self.backoff_max_s < 0:
            raise ValueError("max_restarts, backoff must be >= 0 and window_s > 0")

    def delay(self, recent: int) -> float:
        """Backoff before the restart that follows `recent` restarts within the window."""
        return min(self.backoff_max_s, self.backoff_s * 2**recent)


@dataclass(slots=True)
class _Slot:
    """What the supervisor tracks per supervised process (a worker index, or the router)."""

    restarts: deque[float] = field(default_factory=deque)  # when each restart was started
    due: float | None = None  # a restart is scheduled for this time
    starting: Proc | None = None  # restarted, not yet healthy
    started_at: float = 0.0
    given_up: bool = False


class Supervisor:
    """`Supervisor(cluster).run()` blocks until `stop` is set or nothing can serve any more;
    `poll()` is one pass (tests drive it directly). Events go to `log` (default: stderr)."""

    def __init__(
        self, cluster: Cluster, policy: RestartPolicy | None = None, log: Callable[[str], None] | None = None
    ) -> None:
        self.cluster = cluster
        self.policy = policy or RestartPolicy()
        self.log = log or (lambda msg: print(f"radixagent cluster: {msg}", file=sys.stderr, flush=True))
        self.slots: dict[str, _Slot] = {}
        self.events: list[str] = []  # every logged event, in order (for tests and post-mortems)
        self.http = httpx.Client(timeout=5.0)

    def _note(self, msg: str) -> None:
        self.events.append(msg)
        self.log(msg)

    # ---- the loop -------------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None, interval_s: float = 0.5) -> int:
        """0 when stopped; 1 when no worker is up and none will be restarted, or the router is gone."""
        stop = stop or threading.Event()
        try:
            while not stop.is_set():
                if not self.poll():
                    return 1
                stop.wait(interval_s)
            return 0
        finally:
            self.http.close()

    def poll(self, now: float | None = None) -> bool:
        """One pass; False when the cluster can no longer serve."""
        now = time.monotonic() if now is None else now
        for i in range(len(self.cluster.workers)):
            self._check_worker(i, now)
        self._check_router(now)
        workers_possible = any(not self._slot(w.name).given_up for w in self.cluster.workers)
        return workers_possible and not self._slot("router").given_up

    def _slot(self, name: str) -> _Slot:
        return self.slots.setdefault(name, _Slot())

    # ---- workers --------------------------------------------------------------------------------
    def _check_worker(self, i: int, now: float) -> None:
        proc = self.cluster.workers[i]
        slot = self._slot(proc.name)
        if slot.given_up:
            return
        if slot.starting is not None:
            self._check_starting(i, slot, now)
            return
        if slot.due is None and not proc.alive():
            self._note(
                f"{proc.name} ({proc.url}, pid {proc.popen.pid}) exited with {proc.popen.returncode}; "
                f"log {proc.log}:\n{proc.tail(10)}"
            )
            self._deregister(proc.url)
            self._schedule(proc.name, slot, now)
        if slot.due is not None and now >= slot.due:
            slot.due = None
            new = self.cluster.respawn_worker(i)
            slot.starting, slot.started_at = new, now
            self._note(
                f"{new.name} restarting on {new.url} (pid {new.popen.pid}, restart "
                f"{len(slot.restarts)}/{self.policy.max_restarts} within {self.policy.window_s:.0f} s)"
            )

    def _schedule(self, name: str, slot: _Slot, now: float) -> None:
        while slot.restarts and now - slot.restarts[0] > self.policy.window_s:
            slot.restarts.popleft()
        if len(slot.restarts) >= self.policy.max_restarts:
            slot.given_up = True
            self._note(
                f"{name}: {len(slot.restarts)} restarts within {self.policy.window_s:.0f} s "
                f"(limit {self.policy.max_restarts}); leaving it down"
            )
            return
        delay = self.policy.delay(len(slot.restarts))
        slot.restarts.append(now + delay)
        slot.due = now + delay
        self._note(f"{name}: restart in {delay:.1f} s")

    def _check_starting(self, i: int, slot: _Slot, now: float) -> None:
        proc = slot.starting
        assert proc is not None
        if not proc.alive():
            self._note(
                f"{proc.name} exited with {proc.popen.returncode} while starting; log {proc.log}:\n"
                f"{proc.tail(10)}"
            )
            slot.starting = None
            self._schedule(proc.name, slot, now)
            return
        if now - slot.started_at > self.policy.startup_timeout_s:
            self._note(
                f"{proc.name} not healthy {self.policy.startup_timeout_s:.0f} s after its restart; killing it"
            )
            _signal_group(proc.popen, signal.SIGKILL)
            return  # reaped (and rescheduled) on the next pass
        if self._healthy(proc.url) and self._register(proc.url):  # else: tried again on the next pass
            slot.starting = None
            self._note(f"{proc.name} rejoined the router: {proc.url} (pid {proc.popen.pid})")

    # ---- router ---------------------------------------------------------------------------------
    def _check_router(self, now: float) -> None:
        router, slot = self.cluster.router, self._slot("router")
        if router is None or slot.given_up:
            return
        if slot.due is None and not router.alive():
            self._note(
                f"router ({router.url}) exited with {router.popen.returncode}; log {router.log}:\n"
                f"{router.tail(10)}"
            )
            self._schedule("router", slot, now)
        if slot.due is not None and now >= slot.due:
            slot.due = None
            up = [w for w in self.cluster.workers if w.alive() and self._slot(w.name).starting is not w]
            new = self.cluster.respawn_router([w.url for w in up])
            self._note(f"router restarted on {new.url} (pid {new.popen.pid}) with {len(up)} workers")

    # ---- the router's worker list ---------------------------------------------------------------
    def _healthy(self, url: str) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return self.http.get(url + "/health", timeout=2.0).status_code == 200
        return False

    def _deregister(self, url: str) -> None:
        """Remove `url` from the router's rotation now (both routers: DELETE /workers/{id})."""
        router = self.cluster.router
        if router is None or not router.alive():
            return
        try:
            listed = self.http.get(router.url + "/workers").json().get("workers", [])
            for w in listed:
                if w.get("url") == url and w.get("id"):
                    self.http.delete(f"{router.url}/workers/{w['id']}").raise_for_status()
                    self._note(f"removed {url} from the router's rotation")
        except (httpx.HTTPError, ValueError) as exc:
            self._note(f"could not remove {url} from the router ({exc}); its health checks will")

    def _register(self, url: str) -> bool:
        router = self.cluster.router
        if router is None or not router.alive():
            return True  # the router's restart registers the workers that are up
        try:
            listed = self.http.get(router.url + "/workers").json().get("workers", [])
            if any(w.get("url") == url for w in listed):
                return True
            self.http.post(router.url + "/workers", json={"url": url}).raise_for_status()
            return True
        except (httpx.HTTPError, ValueError) as exc:
            self._note(f"could not register {url} with the router: {exc}")
            return False
