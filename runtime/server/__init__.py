"""SGLang-compatible HTTP server (`radixagent serve`): native /generate plus the OpenAI API."""

from __future__ import annotations

from runtime.server.app import create_app
from runtime.server.args import ServerArgs

__all__ = ["ServerArgs", "create_app"]
