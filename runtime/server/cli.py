"""`radixagent serve`: load the engine, serve the HTTP API until Ctrl-C, then shut the engine down."""

from __future__ import annotations

import logging
import signal
import sys
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

    try:
        engine = Engine(model_path=ns.model_path, **engine_config(ns))
    except ValueError as exc:
        print(f"radixagent serve: {exc}", file=sys.stderr)
        return 2
    # uvicorn drains on SIGTERM, restores the previous handler and re-raises the signal; with this
    # handler the re-raise unwinds to the `finally` below (engine shut down, exit 0) instead of
    # killing the process.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        app = create_app(engine, args)
        uvicorn.Server(uvicorn_config(app, args)).run()
    finally:
        engine.shutdown()
    return 0


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


if __name__ == "__main__":  # `python -m runtime.server.cli` (how `radixagent cluster` starts workers)
    from runtime.env import offline_hub

    offline_hub()
    raise SystemExit(main(sys.argv[1:]))
