"""Fast checks (no model, no processes): the affinity header and the cluster's commands."""

from __future__ import annotations

import json

import httpx
import pytest

from runtime.backends.sglang import ROUTING_KEY_HEADER, SGLangBackend
from runtime.cluster.cluster import POLICIES, SMG_POLICIES, Cluster, ClusterConfig, ClusterError, policy_flags


def _backend(seen: list[httpx.Request], **options: object) -> SGLangBackend:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        out = {
            "text": "ok",
            "output_ids": [1],
            "meta_info": {
                "prompt_tokens": 3,
                "completion_tokens": 1,
                "cached_tokens": 2,
                "finish_reason": {"type": "length"},
            },
        }
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
    with pytest.raises(ValueError):
        ClusterConfig(router="nginx")
    with pytest.raises(ValueError):  # smg only
        ClusterConfig(router="sglang-router", policy="consistent_hashing")
    ClusterConfig(router="auto", policy="consistent_hashing")  # checked again once auto is resolved
    cluster = Cluster(
        ClusterConfig(workers=2, policy="session", router="sglang-router", threads_per_worker=1)
    )
    cmd = cluster._router_cmd(30000)
    assert cmd[1:3] == ["-m", "sglang_router.launch_router"]
    assert cmd[cmd.index("--policy") + 1] == "manual" and "min_group" in cmd
    assert "--routing-key-override" not in cmd
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert POLICIES["cache_aware"] == ("--policy", "cache_aware")
    worker = cluster._worker_cmd(40001)
    assert worker[worker.index("--num-threads") + 1] == "1" and "--enable-metrics" in worker


def test_smg_session_policy_is_cache_aware_with_sticky_keys() -> None:
    cluster = Cluster(ClusterConfig(workers=2, policy="session", router="smg"))
    cmd = cluster._router_cmd(30000)
    assert cmd[1:3] == ["-m", "smg.launch_router"]
    i = cmd.index("--policy")
    assert cmd[i : i + 5] == [
        "--policy",
        "cache_aware",
        "--routing-key-override",
        "--assignment-mode",
        "min_group",
    ]
    # the rest of the command is the same as sglang-router's (smg kept the flag names)
    other = Cluster(ClusterConfig(workers=2, policy="session", router="sglang-router"))._router_cmd(30000)
    common = (
        "--health-check-interval-secs",
        "--health-failure-threshold",
        "--shutdown-grace-period-secs",
        "--prometheus-host",
        "--log-level",
        "--worker-urls",
    )
    assert all(flag in cmd and flag in other for flag in common)
    # smg pins routing keys on every policy unless told not to; sglang-router cannot
    assert policy_flags("round_robin", "smg") == ("--policy", "round_robin", "--routing-key-override")
    assert policy_flags("round_robin", "smg", sticky=False) == ("--policy", "round_robin")
    assert policy_flags("round_robin", "sglang-router") == ("--policy", "round_robin")
    assert policy_flags("session", "smg").count("--routing-key-override") == 1
    assert set(POLICIES) <= set(SMG_POLICIES)  # every sglang-router policy name works on smg too


def test_auto_prefers_smg(monkeypatch: pytest.MonkeyPatch) -> None:
    import runtime.cluster.cluster as rc

    installed = {"smg", "sglang-router"}
    monkeypatch.setattr(
        rc, "router_available", lambda r="auto": bool(installed) if r == "auto" else r in installed
    )
    assert rc.resolve_router("auto") == "smg"
    assert rc.resolve_router("sglang-router") == "sglang-router"
    assert Cluster(ClusterConfig(policy="session")).resolve_router() == "smg"
    installed.discard("smg")
    assert rc.resolve_router("auto") == "sglang-router"
    assert Cluster(ClusterConfig(policy="session"))._router_cmd(1)[2] == "sglang_router.launch_router"
    with pytest.raises(ClusterError):  # auto resolved to a router without the policy
        Cluster(ClusterConfig(policy="consistent_hashing")).resolve_router()
    installed.clear()
    with pytest.raises(ClusterError, match="pip install smg"):
        rc.resolve_router("auto")


def test_router_available_looks_for_the_launcher_module(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from runtime.cluster.cluster import router_available

    found = {"sglang_router.launch_router"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name in found else None)
    assert router_available("sglang-router") and not router_available("smg") and router_available("auto")
    assert not router_available("nope")
    found.clear()
    assert not router_available("auto")


def test_cli_router_flag() -> None:
    from runtime.cluster.cli import build_parser, config_from_args

    ns = build_parser().parse_args(["--router", "smg", "--policy", "consistent_hashing", "--workers", "3"])
    config = config_from_args(ns)
    assert (config.router, config.policy, config.workers) == ("smg", "consistent_hashing", 3)
    assert config_from_args(build_parser().parse_args([])).router == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--router", "nginx"])
