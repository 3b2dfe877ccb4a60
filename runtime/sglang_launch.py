"""`radixagent launch-sglang -- <sglang args>`: exec SGLang's server with the session policy on a
tree core that runs it.

SGLang 0.5.23 builds its radix tree through a tree-core registry
(`sglang/srt/mem_cache/unified_cache/tree_core_registry.py`): the Rust core by default, the Python
core when `SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python`, and the Python core anyway when Rust
cannot serve the configuration (`--enable-session-radix-cache`, custom components, torch outside
2.11-2.14, non-Linux, no Rust build). The Rust core only takes a policy *name* for its native
strategy and refuses `session` ("Unknown eviction policy: session", checked against the 0.5.23
wheel's binding); our policy runs only where the Python core calls `get_priority`.

So, when the session policy is asked for (the default here):
- the variable unset: this launcher sets it to `python` and says so;
- set to `python`: kept;
- set to anything else (e.g. `rust`, forced): kept, never overridden. SGLang then either falls
  back to the Python core for one of its reasons (the policy runs; the plugin logs it) or builds
  the Rust core, which the plugin refuses at start-up with a message saying what to change
  (runtime/sglang_plugin.py). Never a silent switch of core or of policy.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

POLICY_NAME = "session"
CORE_VARIABLE = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"
COMPACT_JSON = "--constrained-json-disable-any-whitespace"


def _policy(args: Sequence[str]) -> str | None:
    for i, a in enumerate(args):
        if a == "--radix-eviction-policy" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--radix-eviction-policy="):
            return a.split("=", 1)[1]
    return None


def launch_command(argv: Sequence[str], python: str = sys.executable) -> list[str]:
    args = list(argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if _policy(args) is None:
        args = ["--radix-eviction-policy", POLICY_NAME, *args]
    if COMPACT_JSON not in args:
        # SGLang's JSON grammars admit any whitespace by default; a small model then pads its
        # tool calls with spaces and newlines until max_new_tokens and no JSON ever closes. The
        # embedded engine's grammars are compact: same constraint, same outputs on both backends.
        args.append(COMPACT_JSON)
    return [python, "-m", "sglang.launch_server", *args]


def tree_core_env(environ: Mapping[str, str], cmd: Sequence[str]) -> tuple[dict[str, str], str]:
    """(variables to set for the server, the line that says which core and policy run)."""
    policy = _policy(cmd) or "lru"
    asked = environ.get(CORE_VARIABLE) or None
    session_cache = "--enable-session-radix-cache" in cmd
    if policy != POLICY_NAME:
        return {}, f"policy {policy}: SGLang's own, on the tree core SGLang picks (the plugin is idle)"
    if asked is None:
        return {CORE_VARIABLE: "python"}, (
            f"policy session on SGLang's Python tree core ({CORE_VARIABLE}=python set by launch-sglang)"
        )
    if asked == "python":
        return {}, f"policy session on SGLang's Python tree core ({CORE_VARIABLE}=python)"
    if session_cache:
        return {}, (
            f"policy session, {CORE_VARIABLE}={asked} kept: SGLang falls back to its Python tree core "
            "for --enable-session-radix-cache, where the policy runs"
        )
    return {}, (
        f"policy session, {CORE_VARIABLE}={asked} kept: if SGLang builds that core the plugin refuses "
        "to start (the policy runs only on the Python core); if SGLang falls back to Python, it runs"
    )


def main(argv: list[str]) -> int:
    """This is the process's launcher: the one place, with runtime/env.py, that sets environment
    variables (for the server it execs)."""
    if argv[:1] in (["-h"], ["--help"]):
        print(
            "usage: radixagent launch-sglang -- <sglang.launch_server args>\n"
            "Starts `python -m sglang.launch_server --radix-eviction-policy session ...` with compact "
            f"JSON grammars ({COMPACT_JSON}) and, for the session policy, {CORE_VARIABLE}=python "
            "unless you set it (needs sglang installed)."
        )
        return 0
    cmd = launch_command(argv)
    updates, line = tree_core_env(os.environ, cmd)
    print(f"radixagent launch-sglang: {line}", file=sys.stderr, flush=True)
    os.execvpe(cmd[0], cmd, dict(os.environ, **updates))
    return 0  # not reached
