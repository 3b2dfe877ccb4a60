from __future__ import annotations

import sys
import types

from runtime import sglang_plugin


def test_imports_without_sglang_and_builds_launch_command() -> None:
    cmd = sglang_plugin.launch_command(["--", "--model-path", "m", "--port", "1"], python="py")
    assert cmd == [
        "py",
        "-m",
        "sglang.launch_server",
        "--radix-eviction-policy",
        "session",
        "--model-path",
        "m",
        "--port",
        "1",
        "--constrained-json-disable-any-whitespace",
    ]
    keep = sglang_plugin.launch_command(["--radix-eviction-policy=lru"], python="py")
    assert keep == [
        "py",
        "-m",
        "sglang.launch_server",
        "--radix-eviction-policy=lru",
        "--constrained-json-disable-any-whitespace",
    ]


def test_register_against_fake_sglang(monkeypatch) -> None:
    utils = types.ModuleType("sglang.srt.mem_cache.utils")
    utils._EVICTION_POLICY_FACTORIES = {"lru": object}
    args = types.ModuleType("sglang.srt.server_args")
    args.RADIX_EVICTION_POLICY_CHOICES = ["lru"]
    args.add_radix_eviction_policy_choices = args.RADIX_EVICTION_POLICY_CHOICES.extend
    for name in ("sglang", "sglang.srt", "sglang.srt.mem_cache"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.mem_cache.utils", utils)
    monkeypatch.setitem(sys.modules, "sglang.srt.server_args", args)
    # The real client may be loaded in this process (test_sglang_client): hide its other modules.
    for name in (
        "sglang.srt.arg_groups",
        "sglang.srt.arg_groups.choices",
        "sglang.srt.mem_cache.evict_policy",
        "sglang.srt.mem_cache.unified_cache.components.base",
    ):
        monkeypatch.setitem(sys.modules, name, None)
    sglang_plugin.register()
    sglang_plugin.register()
    assert args.RADIX_EVICTION_POLICY_CHOICES == ["lru", "session"]
    strategy = utils._EVICTION_POLICY_FACTORIES["session"](share_weight=2.0)
    node = types.SimpleNamespace(id=1, last_access_time=0.0, session_ref=3)
    plain = types.SimpleNamespace(id=2, last_access_time=0.0)
    assert strategy.get_priority(node) > strategy.get_priority(plain)
