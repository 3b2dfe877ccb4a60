"""SGLang plugin: adds `--radix-eviction-policy session` to a real SGLang server.

Installed through the entry point `sglang.srt.plugins: radixagent_session =
runtime.sglang_plugin:register`; SGLang loads it before parsing its CLI and in each scheduler
process. Nothing from sglang is imported at module import time, so this module imports (and its
tests run) without sglang installed.

Inside SGLang the policy sees SGLang's tree nodes (no `sessions` set). Verified against the
installed sglang 0.5.23 source (sglang/srt/mem_cache/unified_cache/): the server's tree is
`UnifiedRadixCache`; a node's per-component state is `node.component_data[ComponentType.FULL]`
(a `ComponentData` with `lock_ref`, `session_ref: int`, `session_ids: set | None`), and with
`--enable-session-radix-cache` `session_ref` counts the open sessions whose latest insert runs
through the node (leaf to root; closing a session decrements it). `node.last_access_time` there is
a global logical counter (+1 per touch), not seconds; the older `RadixCache` uses time.monotonic().
The FULL component already orders candidates by `(session_ref > 0, session_ref, get_priority(node))`
when session radix cache is on, so referenced nodes leave last whatever the policy says.

The policy uses, in order: the side table `node_sessions` (node id -> session ids, for callers
that fill it), then that session reference count (nodes referenced by open sessions are live,
shared in proportion to the count; unreferenced ones, such as a closed session's, go first), and
otherwise recency in the node's own clock: with no session facts it is exactly LRU.

Which tree core runs it: SGLang 0.5.23's Rust core takes only a policy name and refuses
`session`; the Python core calls `get_priority`. `make_strategy` is called by both (the Rust
adapter builds the strategy only to validate its options), so it knows which core asked: on the
Rust core it refuses with a message naming the fix, on a Python core it logs one line saying the
policy runs there. `radixagent launch-sglang` (runtime/sglang_launch.py) selects the Python core.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Sequence

from runtime.cache.session_policy import LIVE, SessionPolicy

POLICY_NAME = "session"
# Where SGLang 0.5.x keeps the pieces (searched in order; layouts moved between releases).
_FACTORY_MODULES = ("sglang.srt.mem_cache.utils", "sglang.srt.mem_cache.evict_policy")
_CHOICE_MODULES = ("sglang.srt.arg_groups.choices", "sglang.srt.server_args")
_FULL = 0  # sglang.srt.mem_cache.unified_cache.component_type.ComponentType.FULL (an int enum)
_COUNTER_MODULE = "sglang.srt.mem_cache.unified_cache.components.base"
#: who builds the strategy: SGLang's tree cores (module names in 0.5.23)
_RUST_CORE = "sglang.srt.mem_cache.rust_tree_core"
_PYTHON_CORES = {
    "sglang.srt.mem_cache.unified_cache.unified_tree_core": "Python UnifiedTreeCore",
    "sglang.srt.mem_cache.radix_cache": "Python RadixCache",
}
log = logging.getLogger("radixagent.sglang_plugin")


class RustTreeCoreRefused(ValueError):
    """The session policy was asked of SGLang's Rust tree core, which cannot run it."""


class SGLangSessionPolicy(SessionPolicy):
    """`SessionPolicy` reading SGLang's session reference counts when nodes carry no session ids."""

    def get_priority(self, node: object) -> tuple[int, float]:
        if getattr(node, "sessions", None) is None and getattr(node, "id", -1) not in self.node_sessions:
            now = _node_clock_now(node, self.clock)
            age = max(0.0, now - node.last_access_time)  # type: ignore[attr-defined]
            refs = _session_refs(node)
            if refs:
                return (LIVE, -age / (1.0 + self.share_weight * (refs - 1)))
            return (LIVE, -age)  # LRU, in the node's own clock
        return super().get_priority(node)


def _session_refs(node: object) -> int:
    """Open sessions referencing the node: SGLang 0.5.23's `component_data[FULL].session_ref`
    (a plain `session_ref` attribute is accepted for older or test trees)."""
    data = getattr(node, "component_data", None)
    if data:
        return int(getattr(data[_FULL], "session_ref", 0) or 0)
    value = getattr(node, "session_ref", 0)
    return value if isinstance(value, int) else 0


def _node_clock_now(node: object, clock) -> float:
    """'Now' in the unit of `node.last_access_time`: the unified tree's logical counter, else seconds."""
    if getattr(node, "component_data", None) is None:
        return clock()
    counter = sys.modules.get(_COUNTER_MODULE)
    now = getattr(counter, "_LAST_ACCESS_TIME_COUNTER_FLOAT", None)
    return float(now) if now is not None else float(node.last_access_time)  # type: ignore[attr-defined]


def make_strategy(**config: object) -> SGLangSessionPolicy:
    """SGLang calls the factory with `--radix-eviction-policy-config` JSON as kwargs."""
    core = _building_core()
    if core == "rust":
        raise RustTreeCoreRefused(
            "radixagent: --radix-eviction-policy session runs only on SGLang's Python tree core, and "
            "SGLang is building its Rust tree core (which would refuse the name anyway). Set "
            "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python or add --enable-session-radix-cache "
            "(`radixagent launch-sglang` sets the variable to python when it is unset)."
        )
    policy = SGLangSessionPolicy(**config)  # type: ignore[arg-type]
    if core is not None:
        log.warning("radixagent: eviction policy session in force on SGLang's %s", core)
    return policy


def _building_core(depth: int = 12) -> str | None:
    """ "rust", a Python core's name, or None (called from elsewhere: tests, tools), read from the
    modules of the calling frames."""
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            break
        module = str(frame.f_globals.get("__name__", ""))
        if module.startswith(_RUST_CORE):
            return "rust"
        if module in _PYTHON_CORES:
            return _PYTHON_CORES[module]
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _first_module_with(names: Sequence[str], attr: str):
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, attr):
            return module
    return None


def register() -> None:
    """Entry point: register the factory and extend the CLI choices (idempotent)."""
    factories = _first_module_with(_FACTORY_MODULES, "_EVICTION_POLICY_FACTORIES")
    if factories is None:
        raise RuntimeError("sglang has no _EVICTION_POLICY_FACTORIES: unsupported sglang version")
    factories._EVICTION_POLICY_FACTORIES[POLICY_NAME] = make_strategy
    choices = _first_module_with(_CHOICE_MODULES, "add_radix_eviction_policy_choices")
    if choices is not None:
        current = getattr(choices, "RADIX_EVICTION_POLICY_CHOICES", [])
        if POLICY_NAME not in current:
            choices.add_radix_eviction_policy_choices([POLICY_NAME])
