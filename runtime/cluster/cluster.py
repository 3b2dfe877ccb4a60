"""`radixagent cluster`: N local `radixagent serve` workers behind SGLang's router, on loopback.

`Cluster` (a context manager) starts each worker as its own process with its own KV budget on a
random free port, waits until every worker answers /health, then starts the router and waits until
it reports every worker healthy. Leaving the context stops the router first, then the workers
(SIGTERM to each process group, SIGKILL after a grace period), so no process outlives it.

Two routers, the same gateway under two package names (`ClusterConfig.router`, `--router`):
- `smg` (Shepherd Model Gateway, `pip install smg`, `python -m smg.launch_router`), the maintained
  successor; `auto` prefers it when it is installed.
- `sglang-router` 0.3.x (`python -m sglang_router.launch_router`), its last release under the old name.

Routing policies are the router's own (`--policy`), plus `session`, which keeps one agent session on
one worker by the `X-SMG-Routing-Key` header our SGLang backend fills with the session id:
- on smg: `--policy cache_aware --routing-key-override --assignment-mode min_group`: keyed requests
  are sticky (a new key goes to the worker with the fewest keys), key-less requests are routed
  cache-aware;
- on sglang-router: its `manual` policy with `min_group`; key-less requests go to a random worker.
On smg every other policy also pins routing keys (`--routing-key-override`, `sticky_sessions`), so
a plain `cache_aware` or `round_robin` keeps an agent session on its worker too.
See docs/cluster.md.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from runtime.server.cli import serve_argv
from runtime.server.ready import NotReady, wait_ready

#: the routers `Cluster` can start, preferred first (what `router="auto"` picks)
ROUTERS: tuple[str, ...] = ("smg", "sglang-router")
#: router (its package name on the index) -> the module that launches it (`python -m ...`)
ROUTER_MODULES: dict[str, str] = {"smg": "smg.launch_router", "sglang-router": "sglang_router.launch_router"}

#: our policy name -> sglang-router 0.3.x flags (its choices, plus `session`)
POLICIES: dict[str, tuple[str, ...]] = {
    "cache_aware": ("--policy", "cache_aware"),
    "round_robin": ("--policy", "round_robin"),
    "random": ("--policy", "random"),
    "power_of_two": ("--policy", "power_of_two"),
    "manual": ("--policy", "manual"),
    "session": ("--policy", "manual", "--assignment-mode", "min_group"),
}
#: our policy name -> smg 1.x flags. `session`: sticky by routing key on top of cache_aware, so
#: requests without a key keep cache-aware routing (sglang-router's `manual` sends them anywhere).
SMG_POLICIES: dict[str, tuple[str, ...]] = {
    **POLICIES,
    "least_load": ("--policy", "least_load"),
    "consistent_hashing": ("--policy", "consistent_hashing"),
    "prefix_hash": ("--policy", "prefix_hash"),
    "session": ("--policy", "cache_aware", "--routing-key-override", "--assignment-mode", "min_group"),
}
ROUTER_POLICIES: dict[str, dict[str, tuple[str, ...]]] = {"smg": SMG_POLICIES, "sglang-router": POLICIES}
ALL_POLICIES: tuple[str, ...] = tuple(sorted(set(POLICIES) | set(SMG_POLICIES)))
INSTALL_HINT = "pip install smg==1.13.0 (or sglang-router==0.3.2)"


class ClusterError(RuntimeError):
    """A worker or the router failed to start or died; the message carries its log tail."""


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    workers: int = 2
    #: router port on `host`; 0 picks a free one
    port: int = 0
    host: str = "127.0.0.1"
    policy: str = "cache_aware"
    #: "auto" (smg if installed, else sglang-router), "smg" or "sglang-router"
    router: str = "auto"
    #: extra `radixagent serve` flags for every worker (e.g. ("--max-total-tokens", "8192"))
    worker_args: tuple[str, ...] = ()
    #: extra router flags
    router_args: tuple[str, ...] = ()
    #: torch threads per worker; None: the machine's cores split between the workers
    threads_per_worker: int | None = None
    startup_timeout_s: float = 900.0
    #: where process logs go; None: a fresh temporary folder
    log_dir: str | None = None
    #: on smg, pin every `X-SMG-Routing-Key` (our backend's session id) to a worker whatever the
    #: policy (`--routing-key-override`: a new key is placed by the policy, then sticks); key-less
    #: requests are routed by the policy as before. sglang-router 0.3.2 pins only under `manual` /
    #: `session`.
    sticky_sessions: bool = True

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.router != "auto" and self.router not in ROUTERS:
            raise ValueError(f"unknown router {self.router!r}; known: auto, {', '.join(ROUTERS)}")
        check_policy(self.policy, self.router)
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("the local cluster binds to loopback only (host 127.0.0.1)")


@dataclass(slots=True)
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    url: str

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Cluster:
    """`with Cluster(ClusterConfig(workers=2)) as c: connect(c.url)`; `c.worker_urls` for per-worker stats."""

    config: ClusterConfig = field(default_factory=ClusterConfig)
    workers: list[Proc] = field(default_factory=list)
    router: Proc | None = None
    log_dir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()))
    #: the router in use ("smg" or "sglang-router"): `config.router` with "auto" resolved
    router_kind: str = ""
    #: the workers' shared tier MAC key (one per cluster unless the environment names one), handed
    #: over in the environment: a command line is visible to every local user
    tier_key: str = field(default_factory=lambda: secrets.token_hex(32), repr=False)

    @property
    def url(self) -> str:
        if self.router is None:
            raise ClusterError("cluster not started")
        return self.router.url

    @property
    def worker_urls(self) -> list[str]:
        return [w.url for w in self.workers]

    def resolve_router(self) -> str:
        """`config.router` with "auto" resolved (once); ClusterError when no router is installed."""
        if not self.router_kind:
            self.router_kind = resolve_router(self.config.router)
            try:
                check_policy(self.config.policy, self.router_kind)
            except ValueError as exc:
                raise ClusterError(str(exc)) from None
        return self.router_kind

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> Proc:
        """Workers, then the router once every worker is healthy; returns the router's process."""
        kind = self.resolve_router()
        if not router_available(kind):
            raise ClusterError(f"router {kind!r} is not installed in {sys.executable}: {INSTALL_HINT}")
        log_dir = Path(self.config.log_dir or tempfile.mkdtemp(prefix="radixagent-cluster-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        deadline = time.monotonic() + self.config.startup_timeout_s
        try:
            for i in range(self.config.workers):
                self.workers.append(self._spawn(f"worker{i}", self._worker_cmd, log_dir))
            for w in self.workers:
                _wait_http(w, "/health", deadline, lambda r: r.status_code == 200)
            router = self.router = self._spawn("router", self._router_cmd, log_dir, port=self.config.port)
            _wait_http(router, "/workers", deadline, self._all_registered)
        except BaseException:
            self.stop()
            raise
        return router

    def stop(self, grace_s: float = 10.0) -> None:
        """Router first (no new traffic), then the workers; idempotent."""
        procs = ([self.router] if self.router else []) + list(reversed(self.workers))
        for p in procs:
            _signal_group(p.popen, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            _signal_group(p.popen, signal.SIGKILL)  # the group: children the process left behind
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=5)

    def restart_router(self, policy: str, router: str | None = None) -> None:
        """Swap the router for one with `policy` (and `router`, default the same), keeping the workers
        (and their caches) up."""
        kind = resolve_router(router) if router else self.resolve_router()
        check_policy(policy, kind)
        if not router_available(kind):
            raise ClusterError(f"router {kind!r} is not installed in {sys.executable}: {INSTALL_HINT}")
        if self.router is not None:
            _signal_group(self.router.popen, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.router.popen.wait(timeout=10)
            _signal_group(self.router.popen, signal.SIGKILL)
            self.router.popen.wait(timeout=5)
        self.config = replace(self.config, policy=policy, router=kind)
        self.router_kind = kind
        port = int(self.router.url.rsplit(":", 1)[1]) if self.router else self.config.port
        self.router = self._spawn("router", self._router_cmd, self.log_dir, port=port)
        _wait_http(self.router, "/workers", time.monotonic() + 120, self._all_registered)

    def kill_worker(self, index: int) -> None:
        """SIGKILL one worker (fault injection); the router's health checks and retries route around it."""
        _signal_group(self.workers[index].popen, signal.SIGKILL)
        self.workers[index].popen.wait(timeout=10)

    def kill_router(self) -> None:
        """SIGKILL the router (fault injection)."""
        assert self.router is not None
        _signal_group(self.router.popen, signal.SIGKILL)
        self.router.popen.wait(timeout=10)

    def respawn_worker(self, index: int) -> Proc:
        """Start worker `index` again on a fresh port (its log is appended to); the caller registers
        the new URL with the router (runtime/cluster/supervisor.py says why not the old port)."""
        old = self.workers[index]
        _signal_group(old.popen, signal.SIGKILL)  # whatever the dead process left in its group
        self.workers[index] = self._spawn(old.name, self._worker_cmd, self.log_dir, append=True)
        return self.workers[index]

    def respawn_router(self, worker_urls: list[str]) -> Proc:
        """Start the router again on its port with `worker_urls` (the workers that are up)."""
        assert self.router is not None
        _signal_group(self.router.popen, signal.SIGKILL)
        port = int(self.router.url.rsplit(":", 1)[1])
        self.router = self._spawn(
            "router", lambda p: self._router_cmd(p, worker_urls), self.log_dir, port=port, append=True
        )
        return self.router

    # ---- per-worker statistics ---------------------------------------------------------------
    def worker_stats(self, timeout_s: float = 10.0) -> list[dict[str, object]]:
        """Each live worker's /get_server_info `cache_stats` (+ `url`); dead workers give `{"url", "error"}`."""
        out: list[dict[str, object]] = []
        for w in self.workers:
            try:
                info = httpx.get(w.url + "/get_server_info", timeout=timeout_s).json()
                out.append({"url": w.url, **info.get("cache_stats", {})})
            except (httpx.HTTPError, ValueError) as exc:
                out.append({"url": w.url, "error": f"{type(exc).__name__}: {exc}"})
        return out

    def flush(self) -> None:
        for w in self.workers:
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(w.url + "/flush_cache", timeout=30)

    # ---- commands ------------------------------------------------------------------------------
    def _spawn(
        self,
        name: str,
        cmd_for: Callable[[int], list[str]],
        log_dir: Path,
        port: int = 0,
        append: bool = False,
    ) -> Proc:
        port = port or free_port(self.config.host)
        log = log_dir / f"{name}.log"
        with open(log, "ab" if append else "wb") as fh:
            if append:
                fh.write(
                    f"\n--- {name} restarted on port {port} at {time.strftime('%H:%M:%S')} ---\n".encode()
                )
                fh.flush()
            env = {**os.environ}
            env.setdefault("RADIXAGENT_HICACHE_MAC_KEY", self.tier_key)  # workers sharing a tier
            popen = subprocess.Popen(
                cmd_for(port),
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stop() signals the whole group
            )
        return Proc(name, popen, log, f"http://{self.config.host}:{port}")

    def _worker_cmd(self, port: int) -> list[str]:
        args = list(self.config.worker_args)
        threads = self.config.threads_per_worker or max(1, (os.cpu_count() or 1) // self.config.workers)
        if "--num-threads" not in args:
            args += ["--num-threads", str(threads)]
        if "--enable-metrics" not in args:
            args.append("--enable-metrics")
        return [
            *serve_argv(port, self.config.host),
            "--log-level",
            "warning",
            "--worker-id",
            str(port),
            *args,
        ]

    def _router_cmd(self, port: int, worker_urls: list[str] | None = None) -> list[str]:
        """The same flags on both routers (smg kept sglang-router's names), except the policy's."""
        kind = self.resolve_router()
        urls = self.worker_urls if worker_urls is None else worker_urls
        return [
            sys.executable,
            "-m",
            ROUTER_MODULES[kind],
            "--host",
            self.config.host,
            "--port",
            str(port),
            "--worker-urls",
            *urls,
            *policy_flags(self.config.policy, kind, self.config.sticky_sessions),
            "--prometheus-host",
            self.config.host,
            "--prometheus-port",
            str(free_port(self.config.host)),
            "--health-check-interval-secs",
            "1",
            "--health-failure-threshold",
            "2",
            "--shutdown-grace-period-secs",
            "2",
            "--log-level",
            "warn",
            *self.config.router_args,
        ]

    def _all_registered(self, resp: httpx.Response) -> bool:
        if resp.status_code != 200:
            return False
        workers = resp.json().get("workers", [])
        return sum(bool(w.get("is_healthy")) for w in workers) == self.config.workers


def router_available(router: str = "auto") -> bool:
    """True when `router` ("smg", "sglang-router"; "auto": either) can be launched with this Python.

    Looks for the launcher module, not a console script: sglang-router 0.3.2 also installs a
    command named `smg`, so `which smg` does not tell the two packages apart.
    """
    import importlib.util

    if router == "auto":
        return any(router_available(r) for r in ROUTERS)
    module = ROUTER_MODULES.get(router)
    if module is None:
        return False
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # the parent package is missing or broken
        return False


def resolve_router(router: str = "auto") -> str:
    """The router to launch: "auto" -> the first installed of ROUTERS (smg, then sglang-router)."""
    if router != "auto":
        if router not in ROUTERS:
            raise ValueError(f"unknown router {router!r}; known: auto, {', '.join(ROUTERS)}")
        return router
    for r in ROUTERS:
        if router_available(r):
            return r
    raise ClusterError(f"no router installed in {sys.executable}: {INSTALL_HINT}")


def check_policy(policy: str, router: str = "auto") -> None:
    """ValueError unless `router` ("auto": any router) has `policy`."""
    known = ALL_POLICIES if router == "auto" else tuple(sorted(ROUTER_POLICIES[router]))
    if policy not in known:
        where = "any router" if router == "auto" else router
        raise ValueError(f"unknown policy {policy!r} for {where}; known: {', '.join(known)}")


def router_version(router: str) -> str:
    """The installed version of `router`'s package, or "?"."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(router)
    except PackageNotFoundError:
        return "?"


#: the smg flag that makes routing keys sticky on any policy (smg 1.13.0: `--routing-key-override`)
STICKY_FLAG = "--routing-key-override"


def policy_flags(policy: str, router: str, sticky: bool = True) -> tuple[str, ...]:
    """The router flags our `policy` maps to on `router` (resolved: "smg" or "sglang-router");
    with `sticky`, smg also pins routing keys (`manual` is keyed already)."""
    check_policy(policy, router)
    flags = ROUTER_POLICIES[router][policy]
    if sticky and router == "smg" and policy != "manual" and STICKY_FLAG not in flags:
        flags = (*flags, STICKY_FLAG)
    return flags


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _signal_group(popen: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, sig)


def _wait_http(proc: Proc, path: str, deadline: float, ready: Callable[[httpx.Response], bool]) -> None:
    """`wait_ready` on one of the cluster's processes; ClusterError (with its log) when it fails."""
    try:
        wait_ready(proc.url, proc.popen, path=path, timeout_s=deadline - time.monotonic(), ready=ready)
    except NotReady as exc:
        raise ClusterError(f"{proc.name}: {exc}; log {proc.log}:\n{proc.tail()}") from None
