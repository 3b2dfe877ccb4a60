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

`main(argv)` is `radixagent launch-sglang -- <sglang args>`.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

from runtime.cache.session_policy import LIVE, SessionPolicy

POLICY_NAME = "session"
# Where SGLang 0.5.x keeps the pieces (searched in order; layouts moved between releases).
_FACTORY_MODULES = ("sglang.srt.mem_cache.utils", "sglang.srt.mem_cache.evict_policy")
_CHOICE_MODULES = ("sglang.srt.arg_groups.choices", "sglang.srt.server_args")
_FULL = 0  # sglang.srt.mem_cache.unified_cache.component_type.ComponentType.FULL (an int enum)
_COUNTER_MODULE = "sglang.srt.mem_cache.unified_cache.components.base"


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
    return SGLangSessionPolicy(**config)  # type: ignore[arg-type]


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


COMPACT_JSON = "--constrained-json-disable-any-whitespace"


def launch_command(argv: Sequence[str], python: str = sys.executable) -> list[str]:
    args = list(argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not any(a == "--radix-eviction-policy" or a.startswith("--radix-eviction-policy=") for a in args):
        args = ["--radix-eviction-policy", POLICY_NAME, *args]
    if COMPACT_JSON not in args:
        # SGLang's JSON grammars admit any whitespace by default; a small model then pads its
        # tool calls with spaces and newlines until max_new_tokens and no JSON ever closes. The
        # embedded engine's grammars are compact: same constraint, same outputs on both backends.
        args.append(COMPACT_JSON)
    return [python, "-m", "sglang.launch_server", *args]


def main(argv: list[str]) -> int:
    """`radixagent launch-sglang -- <sglang args>`: exec SGLang's server with the session policy.

    SGLang's default Rust tree core rejects policy names it does not know, so the Python core
    is selected. This is the process's launcher, so setting its child's environment here is the
    one place this module touches environment variables.
    """
    if argv[:1] in (["-h"], ["--help"]):
        print(
            "usage: radixagent launch-sglang -- <sglang.launch_server args>\n"
            "Starts `python -m sglang.launch_server --radix-eviction-policy session ...` with "
            "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python and compact JSON grammars "
            "(--constrained-json-disable-any-whitespace; needs sglang installed)."
        )
        return 0
    env = dict(os.environ, SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND="python")
    cmd = launch_command(argv)
    os.execvpe(cmd[0], cmd, env)
    return 0  # not reached
