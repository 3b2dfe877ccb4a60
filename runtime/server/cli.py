"""`radixagent serve`: load the engine, serve the HTTP API until Ctrl-C, then shut the engine down."""

from __future__ import annotations

import logging
import signal
import socket
import sys
import time
from types import FrameType

from runtime.server.args import build_parser, engine_config, server_args


def serve_argv(port: int, host: str = "127.0.0.1") -> list[str]:
    """The command line that starts `radixagent serve` in a subprocess on host:port (workers of
    `radixagent cluster`, the soak and stress runs, tests); append further serve flags to it."""
    return [sys.executable, "-m", "runtime.server.cli", "--host", host, "--port", str(port)]


def main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    # force: `radixagent serve` arrives with the dispatcher's WARNING config already installed,
    # which would make --log-level (and the engine's start-up line) silently ineffective
    logging.basicConfig(
        level=ns.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    try:
        args = server_args(ns)
    except ValueError as exc:
        print(f"radixagent serve: {exc}", file=sys.stderr)
        return 2

    import uvicorn

    from runtime.engine.engine import Engine
    from runtime.server.app import create_app
    from runtime.server.serving import uvicorn_config

    try:  # a busy port is reported before the model loads (30-46 s), and the socket is kept
        sock = _listen(args.host, args.port)
    except OSError as exc:
        print(f"radixagent serve: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 3
    config = engine_config(ns)
    print(
        f"radixagent serve: loading {ns.model_path or 'the bundled model'} ({_describe(config)})...",
        file=sys.stderr,
    )
    started = time.monotonic()
    try:
        engine = Engine(model_path=ns.model_path, **config)
    except ValueError as exc:
        sock.close()
        print(f"radixagent serve: {exc}", file=sys.stderr)
        return 2
    url = f"http://{args.host}:{sock.getsockname()[1]}"
    print(f"radixagent serve: ready on {url} ({time.monotonic() - started:.1f} s to load)", file=sys.stderr)
    # uvicorn drains on SIGTERM, restores the previous handler and re-raises the signal; with this
    # handler the re-raise unwinds to the `finally` below (engine shut down, exit 0) instead of
    # killing the process.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        app = create_app(engine, args)
        uvicorn.Server(uvicorn_config(app, args)).run(sockets=[sock])
    finally:
        engine.shutdown()
        sock.close()
    return 0


def _listen(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound now (uvicorn serves on it once the engine is ready)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _describe(config: dict[str, object]) -> str:
    """The engine settings a user picks most, for the start-up line."""
    keys = ("dtype", "torchao_config", "kv_cache_dtype", "max_total_tokens", "device")
    shown = [f"{k}={config[k]}" for k in keys if config.get(k) not in (None, "", "auto")]
    return ", ".join(shown) or "default settings"


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


if __name__ == "__main__":  # `python -m runtime.server.cli` (how `radixagent cluster` starts workers)
    from runtime.env import offline_hub

    offline_hub()
    raise SystemExit(main(sys.argv[1:]))
