"""Two `radixagent serve` workers behind the router on loopback: agent sessions keep hitting the cache.

One cluster start per router (each worker is a process that loads the model), parametrized over
sglang-router and smg; a parameter skips when its package is not installed.
The router runs the `session` policy (sticky `X-SMG-Routing-Key`, which our SGLang backend fills
with the session id: sglang-router's `manual` policy, smg's `cache_aware` + `--routing-key-override`),
so each session's follow-up steps land on the worker that holds its prefix. On smg, session-less
requests are routed cache-aware (tested here with the real model). The last test of each router
kills a worker (fault case).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from runtime.cluster.cluster import Cluster, ClusterConfig, router_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(
        not router_available(), reason="no router installed (pip install smg or sglang-router)"
    ),
]
ROUTERS = [
    pytest.param(
        r,
        id=r,
        marks=pytest.mark.skipif(not router_available(r), reason=f"{r} not installed (pip install {r})"),
    )
    for r in ("sglang-router", "smg")
]

DOC = "Field notes on the lighthouse keepers of the northern coast. " + " ".join(
    f"Entry {i}: the lamp at station {i % 7} was trimmed at dusk and logged by keeper {i % 5}."
    for i in range(30)
)


@pytest.fixture(scope="module", params=ROUTERS)
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """pytest groups the tests by parameter: all of sglang-router's, then all of smg's."""
    config = ClusterConfig(
        workers=2, policy="session", router=request.param, worker_args=("--max-total-tokens", "4096")
    )
    with Cluster(config) as c:
        yield c


def test_router_registers_workers_with_model_metadata(cluster: Cluster) -> None:
    workers = httpx.get(cluster.url + "/workers", timeout=10).json()["workers"]
    assert sorted(w["url"] for w in workers) == sorted(cluster.worker_urls)
    assert all(w["is_healthy"] for w in workers)
    assert all(w["model_id"] != "unknown" for w in workers)  # read from our /server_info
    loads = httpx.get(cluster.url + "/get_loads", timeout=10).json()
    if cluster.router_kind == "sglang-router":
        assert all(entry["load"] >= 0 for entry in loads["workers"])  # our /get_load parses
        return
    # smg 1.13 polls SGLang's newer GET /v1/loads (not /get_load) on its load monitor's first tick,
    # then every 10 s; its /get_loads lists one entry per worker rank once each worker has answered
    deadline = time.monotonic() + 20
    while len(loads.get("loads", [])) < len(cluster.worker_urls) and time.monotonic() < deadline:
        time.sleep(0.5)
        loads = httpx.get(cluster.url + "/get_loads", timeout=10).json()
    assert sorted(entry["worker"] for entry in loads["loads"]) == sorted(cluster.worker_urls), loads
    for entry in loads["loads"]:  # read from our /v1/loads
        assert entry["max_total_num_tokens"] == entry["memory"]["token_capacity"] == 4096, entry
        assert entry["max_running_requests"] > 0 and 0.0 <= entry["token_usage"] <= 1.0, entry


def test_agent_sessions_hit_cache_through_router(cluster: Cluster) -> None:
    from agent import Agent, tool
    from runtime import connect

    @tool
    def lookup(station: int) -> str:
        """Look up the keeper log of one station."""
        return f"station {station}: lamp trimmed, fuel ok"

    backend = connect(cluster.url, max_attempts=4)
    before = {w["url"]: w.get("requests", 0) for w in cluster.worker_stats()}
    try:
        for session in ("alpha", "beta"):
            agent = Agent(
                backend=backend,
                tools=[lookup],
                documents=[DOC],
                max_steps=3,
                reflect=False,
                session_id=session,
                sampling={"max_new_tokens": 48},
            )
            runs = [agent.run(f"Which keeper logged station {n}? Use lookup.") for n in (len(session), 3)]
            calls = [s for r in runs for s in r.trace if s.prompt_tokens > 0]  # model calls, in order
            assert len(calls) >= 2
            assert all(s.cached_tokens > 0 for s in calls[1:]), [
                (s.step, s.kind, s.prompt_tokens, s.cached_tokens) for s in calls
            ]
    finally:
        backend.close()
    after = {w["url"]: w.get("requests", 0) for w in cluster.worker_stats()}
    served = sum(after[u] - before[u] for u in after)
    assert served >= 4  # every model call went through the router to a worker


def test_sessionless_requests_follow_their_prefix_on_smg(cluster: Cluster) -> None:
    """smg `session` policy: a request without a session id (no routing key) is routed cache-aware,
    to the worker that already holds its prompt's prefix, and hits there. Two fresh documents (no
    prefix shared with anything earlier), each sent once and then twice more with a question."""
    if cluster.router_kind != "smg":
        pytest.skip("sglang-router 0.3.2's `manual` policy sends session-less requests to a random worker")
    from runtime import connect

    backend = connect(cluster.url, max_attempts=4)
    sampling = {"max_new_tokens": 1, "temperature": 0.0}
    try:
        for tag in ("Tide table", "Cargo manifest"):
            doc = f"{tag} of pier {len(tag)}. " + " ".join(
                f"{tag} line {i}: slot {i % 13} holds item {i * 17 % 101}." for i in range(25)
            )
            before = _requests(cluster)
            first = backend.generate(prompt=doc, sampling_params=sampling)
            home = _served_by(before, _requests(cluster))
            for q in range(2):
                before = _requests(cluster)
                out = backend.generate(
                    prompt=doc + f"\nQuestion {q}: which slot holds item {q}?", sampling_params=sampling
                )
                assert _served_by(before, _requests(cluster)) == home, (tag, q)
                assert out.cached_tokens >= first.prompt_tokens - 4, (
                    tag,
                    q,
                    first.prompt_tokens,
                    out.cached_tokens,
                )
    finally:
        backend.close()


def _served_by(before: list[int], after: list[int]) -> int:
    """The one worker whose request count went up."""
    grew = [i for i, (a, b) in enumerate(zip(after, before, strict=True)) if a > b]
    assert len(grew) == 1, (before, after)
    return grew[0]


def _requests(cluster: Cluster) -> list[int]:
    return [int(w.get("requests", 0)) for w in cluster.worker_stats()]


def _rows(records: list) -> list[tuple]:
    return [
        (
            r.run_id[:4],
            r.step,
            r.kind,
            r.prompt_tokens,
            r.cached_tokens,
            r.ideal_cached_tokens,
            r.finish_reason,
        )
        for r in records
    ]


def test_worker_killed_mid_run_session_moves_and_completes(cluster: Cluster, tmp_path) -> None:
    """Last in the module (it kills a worker). Kill the worker that serves a session between two steps
    of a run: the router's health checks + retries and our client's retries move the session to the
    other worker; the run completes; the trace shows the miss at the step after the kill (cached far
    below ideal) and full hits again after it."""
    import json
    import time

    from agent import Agent, tool
    from runtime import connect

    @tool
    def lookup(station: int) -> str:
        """Look up the keeper log of one station."""
        return f"station {station}: lamp trimmed, fuel ok"

    backend = connect(cluster.url)  # default retries: the fault must be covered without tuning
    trace = tmp_path / "trace.jsonl"
    agent = Agent(
        backend=backend,
        tools=[lookup],
        documents=[DOC],
        max_steps=4,
        reflect=False,
        session_id="gamma",
        sampling={"max_new_tokens": 48},
        tool_choice="required",
        trace_path=trace,
    )
    task = "Which keeper logged station 6? Use lookup."  # no earlier session asked this
    try:
        before = _requests(cluster)
        warm = agent.run(task)  # the session's worker now holds this run's whole log
        served = [a - b for a, b in zip(_requests(cluster), before, strict=True)]
        assert sorted(served)[0] == 0 and max(served) >= 1, served  # one worker served the session
        victim = served.index(max(served))
        survivor = 1 - victim

        run = agent.start(task)
        first = run.step()  # same prompt as warm's first call: a full hit on the victim
        assert first.record is not None and first.error is None
        cluster.kill_worker(victim)
        started = time.monotonic()
        moved = run.step()  # the step after the kill: retried onto the survivor
        moved_s = time.monotonic() - started
        result = run.run_to_end()
        run.close()
        again = agent.run(task)  # later steps of the session hit again, on the survivor
    finally:
        backend.close()
    records = [*warm.trace, *result.trace, *again.trace]
    diag = {"moved_s": round(moved_s, 1), "victim": victim, "rows": _rows(records)}
    assert result.status != "error" and again.status != "error", diag
    assert all(s.error is None for s in [*result.steps, *again.steps]), diag
    assert moved.record is not None and moved.record.finish_reason != "error", diag
    hit, miss = first.record, moved.record
    assert hit.cached_tokens >= 0.9 * hit.prompt_tokens, diag
    # the miss: the survivor holds at most the shared head, not this session's log
    assert miss.cached_tokens < hit.cached_tokens, diag
    assert miss.ideal_cached_tokens - miss.cached_tokens > 20, diag
    # after the move the session sticks to the survivor and hits again
    after = [r for r in [*result.trace[2:], *again.trace] if r.prompt_tokens > 0]
    assert after and all(r.cached_tokens >= 0.9 * r.ideal_cached_tokens for r in after), diag
    stats = cluster.worker_stats()
    assert "error" in stats[victim] and "error" not in stats[survivor], stats
    # the trace file shows where: the moved step's line has cached far below ideal
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    moved_line = next(d for d in lines if d["run_id"] == result.run_id and d["step"] == moved.index)
    assert moved_line["ideal_cached_tokens"] - moved_line["cached_tokens"] > 20, moved_line
    print("fault:", diag)
