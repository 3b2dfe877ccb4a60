from __future__ import annotations

import sys
import types

from runtime import sglang_launch, sglang_plugin


def test_imports_without_sglang_and_builds_launch_command() -> None:
    cmd = sglang_launch.launch_command(["--", "--model-path", "m", "--port", "1"], python="py")
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
    keep = sglang_launch.launch_command(["--radix-eviction-policy=lru"], python="py")
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


def _called_from(module: str):
    """A function defined in a module named `module` that builds the strategy, as SGLang's tree
    cores do (through `get_eviction_strategy`)."""
    scope: dict = {"__name__": module, "make": sglang_plugin.make_strategy}
    exec("def build(**kw):\n    return make(**kw)\n", scope)
    return scope["build"]


def test_rust_tree_core_is_refused_python_core_logged(caplog) -> None:
    import pytest

    with pytest.raises(
        sglang_plugin.RustTreeCoreRefused, match="SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python"
    ):
        _called_from("sglang.srt.mem_cache.rust_tree_core.adapter")()
    with caplog.at_level("INFO", logger="radixagent.sglang_plugin"):
        policy = _called_from("sglang.srt.mem_cache.unified_cache.unified_tree_core")(share_weight=2.0)
    assert isinstance(policy, sglang_plugin.SGLangSessionPolicy) and policy.share_weight == 2.0
    assert "in force on SGLang's Python UnifiedTreeCore" in caplog.text
    assert isinstance(sglang_plugin.make_strategy(), sglang_plugin.SGLangSessionPolicy)  # tests, tools


def test_launcher_picks_python_core_never_overrides_a_choice() -> None:
    cmd = sglang_launch.launch_command(["--model-path", "m"], python="py")
    var = sglang_launch.CORE_VARIABLE
    updates, line = sglang_launch.tree_core_env({}, cmd)
    assert updates == {var: "python"} and "Python tree core" in line
    assert sglang_launch.tree_core_env({var: "python"}, cmd)[0] == {}
    updates, line = sglang_launch.tree_core_env({var: "rust"}, cmd)
    assert updates == {} and "refuses" in line  # kept: the plugin refuses if SGLang builds Rust
    updates, line = sglang_launch.tree_core_env({var: "rust"}, [*cmd, "--enable-session-radix-cache"])
    assert updates == {} and "falls back to its Python tree core" in line
    lru = sglang_launch.launch_command(["--radix-eviction-policy", "lru"], python="py")
    assert sglang_launch.tree_core_env({}, lru) == ({}, sglang_launch.tree_core_env({}, lru)[1])
    assert "plugin is idle" in sglang_launch.tree_core_env({}, lru)[1]
