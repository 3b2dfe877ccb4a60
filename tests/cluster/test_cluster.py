"""Two `radixagent serve` workers behind sglang-router on loopback: agent sessions keep hitting the cache.

One cluster start for the whole module (each worker is a process that loads the model).
The router runs the `session` policy (sglang-router `manual`: sticky `X-SMG-Routing-Key`), which our
SGLang backend fills with the session id, so each session's follow-up steps land on the worker that
holds its prefix. Skips when sglang-router is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from runtime.cluster import Cluster, ClusterConfig, router_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(
        not router_available(), reason="sglang-router not installed (pip install sglang-router)"
    ),
]

DOC = "Field notes on the lighthouse keepers of the northern coast. " + " ".join(
    f"Entry {i}: the lamp at station {i % 7} was trimmed at dusk and logged by keeper {i % 5}."
    for i in range(30)
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    config = ClusterConfig(workers=2, policy="session", worker_args=("--max-total-tokens", "4096"))
    with Cluster(config) as c:
        yield c


def test_router_registers_workers_with_model_metadata(cluster: Cluster) -> None:
    workers = httpx.get(cluster.url + "/workers", timeout=10).json()["workers"]
    assert sorted(w["url"] for w in workers) == sorted(cluster.worker_urls)
    assert all(w["is_healthy"] for w in workers)
    assert all(w["model_id"] != "unknown" for w in workers)  # read from our /server_info
    loads = httpx.get(cluster.url + "/get_loads", timeout=10).json()["workers"]
    assert all(entry["load"] >= 0 for entry in loads)  # our /get_load parses


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
                backend=backend, tools=[lookup], documents=[DOC], max_steps=3, reflect=False,
                session_id=session, sampling={"max_new_tokens": 48},
            )  # fmt: skip
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
