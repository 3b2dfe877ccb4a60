"""radixagent runtime: the embedded engine, the prefix cache, the server and the backends."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.backends import connect
    from runtime.engine.engine import Engine

__all__ = ["Engine", "connect"]


def __getattr__(name: str) -> Any:
    # Lazy: importing `runtime` must not load torch/transformers (CLI start-up, the SGLang plugin).
    if name == "Engine":
        from runtime.engine.engine import Engine

        return Engine
    if name == "connect":
        from runtime.backends import connect

        return connect
    raise AttributeError(name)
