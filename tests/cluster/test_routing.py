"""Fast checks (no model, no processes): the affinity header and the cluster's commands."""

from __future__ import annotations

import json

import httpx
import pytest

from runtime.backends.sglang import ROUTING_KEY_HEADER, SGLangBackend
from runtime.cluster import POLICIES, Cluster, ClusterConfig


def _backend(seen: list[httpx.Request], **options: object) -> SGLangBackend:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        out = {"text": "ok", "output_ids": [1], "meta_info": {"prompt_tokens": 3, "completion_tokens": 1,
               "cached_tokens": 2, "finish_reason": {"type": "length"}}}  # fmt: skip
        return httpx.Response(200, text=f"data: {json.dumps(out)}\n\ndata: [DONE]\n\n")

    backend = SGLangBackend("http://router.test", **options)  # type: ignore[arg-type]
    backend.client = httpx.Client(base_url=backend.base_url, transport=httpx.MockTransport(answer))
    return backend


def test_session_requests_carry_the_routing_key() -> None:
    seen: list[httpx.Request] = []
    backend = _backend(seen)
    out = backend.generate(prompt="hi", session_id="s-1")
    backend.generate(prompt="hi")
    assert out.cached_tokens == 2
    assert seen[0].headers[ROUTING_KEY_HEADER] == "s-1"
    assert json.loads(seen[0].content)["session_id"] == "s-1"
    assert ROUTING_KEY_HEADER not in seen[1].headers  # session-less: the router's own choice


def test_routing_key_header_can_be_turned_off() -> None:
    seen: list[httpx.Request] = []
    backend = _backend(seen, routing_key_header=None)
    backend.generate(prompt="hi", session_id="s-1")
    assert ROUTING_KEY_HEADER not in seen[0].headers


def test_cluster_config_and_router_command() -> None:
    with pytest.raises(ValueError):
        ClusterConfig(policy="nope")
    with pytest.raises(ValueError):
        ClusterConfig(workers=0)
    with pytest.raises(ValueError):
        ClusterConfig(host="0.0.0.0")
    cluster = Cluster(ClusterConfig(workers=2, policy="session", threads_per_worker=1))
    cmd = cluster._router_cmd(30000)
    assert cmd[cmd.index("--policy") + 1] == "manual" and "min_group" in cmd
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert POLICIES["cache_aware"] == ("--policy", "cache_aware")
    worker = cluster._worker_cmd(40001)
    assert worker[worker.index("--num-threads") + 1] == "1" and "--enable-metrics" in worker
