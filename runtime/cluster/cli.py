"""`radixagent cluster`: parse the flags, start the workers and the router, supervise until Ctrl-C.

Kept apart from runtime/cluster/cluster.py so that the supervisor (which drives a `Cluster`) and the
cluster itself never import each other.
"""

from __future__ import annotations

import argparse
import signal
import sys

from runtime.cluster.cluster import (
    ALL_POLICIES,
    INSTALL_HINT,
    ROUTERS,
    Cluster,
    ClusterConfig,
    ClusterError,
    policy_flags,
    router_available,
    router_version,
)
from runtime.cluster.supervisor import RestartPolicy, Supervisor


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="radixagent cluster",
        description="Start N local `radixagent serve` workers and a router (smg or sglang-router) on "
        "loopback; Ctrl-C stops all.",
    )
    p.add_argument(
        "--workers", type=int, default=2, help="number of workers (each its own process and KV pool)"
    )
    p.add_argument("--port", type=int, default=30000, help="router port on 127.0.0.1")
    p.add_argument(
        "--policy",
        default="cache_aware",
        choices=ALL_POLICIES,
        help="router policy; `session` = sticky X-SMG-Routing-Key (our backend's session id), "
        "key-less requests cache-aware on smg, random on sglang-router",
    )
    p.add_argument(
        "--router",
        default="auto",
        choices=("auto", *ROUTERS),
        help="which router package to launch; auto: smg if installed, else sglang-router",
    )
    p.add_argument(
        "--max-total-tokens", type=int, default=None, help="KV pool size of EACH worker, in tokens"
    )
    p.add_argument(
        "--worker-args",
        default="",
        help='extra `radixagent serve` flags, e.g. "--radix-eviction-policy session"',
    )
    p.add_argument("--router-args", default="", help='extra router flags, e.g. "--cache-threshold 0.5"')
    p.add_argument(
        "--no-sticky-sessions",
        action="store_true",
        help="on smg, do not pin X-SMG-Routing-Key (session ids) to workers under policies other than "
        "session/manual (default: pinned, --routing-key-override)",
    )
    p.add_argument("--threads-per-worker", type=int, default=None)
    p.add_argument("--log-dir", default=None, help="process logs (default: a temporary folder)")
    p.add_argument(
        "--max-restarts",
        type=int,
        default=5,
        help="restarts of a crashed worker (or router) within --restart-window; beyond that it "
        "stays down and the others keep serving (0: never restart)",
    )
    p.add_argument("--restart-window", type=float, default=600.0, help="seconds (see --max-restarts)")
    p.add_argument(
        "--restart-backoff",
        type=float,
        default=1.0,
        help="seconds before a first restart, doubled per further restart in the window (max 30)",
    )
    return p


def config_from_args(ns: argparse.Namespace) -> ClusterConfig:
    import shlex

    worker_args = shlex.split(ns.worker_args)
    if ns.max_total_tokens is not None:
        worker_args += ["--max-total-tokens", str(ns.max_total_tokens)]
    return ClusterConfig(
        workers=ns.workers,
        port=ns.port,
        policy=ns.policy,
        router=ns.router,
        worker_args=tuple(worker_args),
        router_args=tuple(shlex.split(ns.router_args)),
        threads_per_worker=ns.threads_per_worker,
        log_dir=ns.log_dir,
        sticky_sessions=not ns.no_sticky_sessions,
    )


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    if not router_available(ns.router):
        what = "a router" if ns.router == "auto" else ns.router
        print(f"radixagent cluster: needs {what} ({INSTALL_HINT})", file=sys.stderr)
        return 2
    try:
        config = config_from_args(ns)
        cluster = Cluster(config)
        kind = cluster.resolve_router()
    except (ValueError, ClusterError) as exc:
        print(f"radixagent cluster: {exc}", file=sys.stderr)
        return 2
    try:
        restarts = RestartPolicy(
            max_restarts=ns.max_restarts,
            window_s=ns.restart_window,
            backoff_s=ns.restart_backoff,
            startup_timeout_s=config.startup_timeout_s,
        )
    except ValueError as exc:
        print(f"radixagent cluster: {exc}", file=sys.stderr)
        return 2
    for sig in STOP_SIGNALS:
        signal.signal(sig, _raise_interrupt)
    flags = policy_flags(config.policy, kind, config.sticky_sessions)
    about = f"{kind} {router_version(kind)}, policy {config.policy}: {' '.join(flags)}"
    try:
        print(f"starting {config.workers} workers ({about}) ...", file=sys.stderr, flush=True)
        router = cluster.start()
        print(f"router  {cluster.url}  pid {router.popen.pid}  ({about})", flush=True)
        for w in cluster.workers:
            print(f"{w.name:<7} {w.url}  pid {w.popen.pid}  log {w.log}", flush=True)
        print("Ctrl-C stops the router and all workers.", file=sys.stderr, flush=True)
        code = Supervisor(cluster, restarts).run()
        print("radixagent cluster: no worker left to serve; stopping", file=sys.stderr, flush=True)
        return code
    except ClusterError as exc:
        print(f"radixagent cluster: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for sig in STOP_SIGNALS:  # a second Ctrl-C must not cut the shutdown short (orphaned workers)
            signal.signal(sig, signal.SIG_IGN)
        cluster.stop()


#: what stops `radixagent cluster` (SIGHUP: its terminal closed; the workers run in their own sessions
#: and would otherwise outlive it)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _raise_interrupt(signum: int, frame: object) -> None:
    for sig in STOP_SIGNALS:  # once: a second signal during the shutdown is ignored (it is bounded)
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt


if __name__ == "__main__":
    raise SystemExit(main())
