"""The supervisor (runtime/cluster/supervisor.py) against model-free stub workers behind each router.

A worker killed with SIGKILL under load: it leaves the rotation, its sessions move to the live
worker (and stay there after the restart), the live worker's sessions never move, the worker is
restarted and rejoins, and new sessions reach it. Only requests in flight on the killed worker at
the kill may fail. Restarts are bounded. Fast (no model); tests/cluster/test_cluster_crash.py
repeats the kill with real workers through `radixagent cluster`.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from runtime.backends.sglang import ROUTING_KEY_HEADER
from runtime.cluster.cluster import Cluster, ClusterConfig, router_available
from runtime.cluster.supervisor import RestartPolicy, Supervisor

STUB = Path(__file__).with_name("stub_worker.py")
ROUTERS = [
    pytest.param(r, id=r, marks=pytest.mark.skipif(not router_available(r), reason=f"{r} not installed"))
    for r in ("sglang-router", "smg")
]


class StubCluster(Cluster):
    """Stub workers; each start (also a restart) gets a fresh name in its answers: w0, w1, w2, ..."""

    spawned = 0

    def _worker_cmd(self, port: int) -> list[str]:
        name = f"w{self.spawned}"
        self.spawned += 1
        return [sys.executable, str(STUB), "--host", self.config.host, "--port", str(port), "--name", name]

    def stop(self, grace_s: float = 0.2) -> None:
        """A short grace, then SIGKILL: the routers' graceful drain (smg: ~1.2 s) is not under test."""
        super().stop(grace_s)


class CrashingRestarts(StubCluster):
    """Restarted workers exit at once (a worker that cannot come back)."""

    def _worker_cmd(self, port: int) -> list[str]:
        if self.spawned >= self.config.workers:
            return [sys.executable, "-c", "raise SystemExit(3)"]
        return super()._worker_cmd(port)


@dataclass
class Call:
    key: str
    sent: float
    ended: float
    status: int | str
    worker: str | None


def _call(url: str, key: str, text: str) -> Call:
    sent = time.monotonic()
    body = {"text": text, "sampling_params": {"max_new_tokens": 1}}
    try:
        r = httpx.post(url + "/generate", json=body, headers={ROUTING_KEY_HEADER: key}, timeout=30)
        worker = r.json()["meta_info"]["worker"] if r.status_code == 200 else None
        return Call(key, sent, time.monotonic(), r.status_code, worker)
    except httpx.HTTPError as exc:
        return Call(key, sent, time.monotonic(), type(exc).__name__, None)


@pytest.fixture(params=ROUTERS)
def supervised(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[StubCluster, Supervisor]]:
    config = ClusterConfig(
        workers=2, policy="session", router=request.param, startup_timeout_s=90, log_dir=str(tmp_path)
    )
    cluster = StubCluster(config)
    cluster.start()
    sup = Supervisor(cluster, RestartPolicy(backoff_s=0.1), log=lambda msg: None)
    stop = threading.Event()
    thread = threading.Thread(target=sup.run, args=(stop, 0.1), daemon=True)
    thread.start()
    try:
        yield cluster, sup
    finally:
        stop.set()
        thread.join(timeout=10)
        cluster.stop()


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow  # kills and restarts processes, or sends hundreds of requests: seconds each
def test_killed_worker_leaves_rotation_restarts_and_rejoins(supervised) -> None:
    cluster, sup = supervised
    keys = [f"s{i}" for i in range(8)]
    with ThreadPoolExecutor(len(keys)) as pool:  # concurrent first requests: min_group spreads them
        home = {c.key: c.worker for c in pool.map(lambda k: _call(cluster.url, k, f"{k} warm"), keys)}
    assert set(home.values()) == {"w0", "w1"}, home
    victim = cluster.workers[0]

    calls: list[Call] = []
    stop = threading.Event()

    def session_loop(key: str) -> None:  # one session: a request after another, each 0.3 s in flight
        step = 0
        while not stop.is_set():
            calls.append(_call(cluster.url, key, f"{key} step {step} [[sleep=0.3]]"))
            step += 1

    loops = [threading.Thread(target=session_loop, args=(k,)) for k in keys]
    for t in loops:
        t.start()
    time.sleep(0.6)  # every session a step or two in: some in flight on the victim at the kill
    killed = time.monotonic()
    cluster.kill_worker(0)
    rejoined = _wait_for(lambda: any("rejoined" in e for e in sup.events), 60)
    time.sleep(1.5)  # traffic after the rejoin
    stop.set()
    for t in loops:
        t.join(timeout=30)
    diag = {"events": sup.events, "home": home}
    assert rejoined, diag

    # Failures: only requests in flight on the killed worker at the kill (its sessions, sent before it)
    failed = [c for c in calls if c.status != 200]
    in_flight = [c for c in calls if c.sent < killed < c.ended and home[c.key] == "w0"]
    assert all(c in in_flight for c in failed), ([c for c in failed if c not in in_flight], diag)
    assert all(c.status == 200 for c in calls if c.sent >= killed), diag
    print(f"in flight on the victim at the kill: {len(in_flight)}, failed: {len(failed)}")

    # The live worker's sessions never moved; the victim's moved once, to the live worker, and stayed
    for key in keys:
        served = [c.worker for c in calls if c.key == key and c.status == 200 and c.sent >= killed]
        assert served and set(served) == {"w1"}, (key, home[key], served)

    # The restarted worker is in the rotation under a new URL and serves new sessions
    def in_rotation() -> set[str]:
        """The workers the router routes to. smg keeps a removed worker listed for 5 s with
        status "draining" (not routed to, is_healthy false); sglang-router drops it at once."""
        workers = httpx.get(cluster.url + "/workers", timeout=10).json()["workers"]
        return {w["url"] for w in workers if w.get("status") != "draining"}

    assert _wait_for(lambda: victim.url not in in_rotation(), 30), (in_rotation(), victim.url, sup.events)
    assert cluster.workers[0].url in in_rotation(), sup.events
    with ThreadPoolExecutor(8) as pool:
        fresh = list(
            pool.map(lambda k: _call(cluster.url, k, f"{k} [[sleep=0.5]]"), [f"n{i}" for i in range(8)])
        )
    assert all(c.status == 200 for c in fresh), fresh
    assert "w2" in {c.worker for c in fresh}, fresh  # w2: the restarted worker's name


@pytest.mark.slow  # kills and restarts processes, or sends hundreds of requests: seconds each
def test_restarts_are_bounded_and_the_rest_keeps_serving(tmp_path: Path) -> None:
    router = next((r for r in ("smg", "sglang-router") if router_available(r)), None)
    if router is None:
        pytest.skip("no router installed")
    config = ClusterConfig(
        workers=2, policy="session", router=router, startup_timeout_s=90, log_dir=str(tmp_path)
    )
    with CrashingRestarts(config) as cluster:
        sup = Supervisor(cluster, RestartPolicy(max_restarts=2, backoff_s=0.1), log=lambda msg: None)
        cluster.kill_worker(0)
        deadline = time.monotonic() + 30
        while not sup.slots.get("worker0", None) or not sup.slots["worker0"].given_up:
            assert sup.poll(), sup.events  # the other worker is up: the cluster can still serve
            assert time.monotonic() < deadline, sup.events
            time.sleep(0.1)
        assert sum("restarting on" in e for e in sup.events) == 2, sup.events
        assert "leaving it down" in sup.events[-1], sup.events
        ok = [_call(cluster.url, f"k{i}", "after").status for i in range(6)]
        assert ok == [200] * 6, ok
        cluster.kill_worker(1)
        deadline = time.monotonic() + 30
        while sup.poll():  # worker1 now crashes on every restart too: then nothing can serve
            assert time.monotonic() < deadline, sup.events
            time.sleep(0.1)


def test_restart_backoff_doubles_and_is_capped() -> None:
    policy = RestartPolicy(backoff_s=1.0, backoff_max_s=5.0)
    assert [policy.delay(n) for n in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    with pytest.raises(ValueError):
        RestartPolicy(max_restarts=-1)


def test_killed_router_is_restarted_on_its_port(supervised) -> None:
    cluster, sup = supervised
    url = cluster.url
    assert _call(url, "k", "before").status == 200
    old = cluster.router
    cluster.kill_router()
    assert _wait_for(lambda: any("router restarted" in e for e in sup.events), 30), sup.events
    assert cluster.router is not old and cluster.url == url
    assert _wait_for(lambda: _call(url, "k", "after").status == 200, 60), sup.events

    # the restarted router adds workers as their health checks pass: one can serve before both are listed
    def listed() -> list[str]:
        return sorted(w["url"] for w in httpx.get(url + "/workers", timeout=10).json()["workers"])

    assert _wait_for(lambda: listed() == sorted(cluster.worker_urls), 30), (listed(), sup.events)
