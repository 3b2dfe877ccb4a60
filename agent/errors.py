"""Typed errors of the agent layer. Control flow branches on the type, never on the message."""

from __future__ import annotations

from runtime.errors import RadixAgentError


class AgentError(RadixAgentError):
    """Base of the agent layer's errors."""


class ToolError(AgentError):
    """A tool call failed (bad arguments, exception, timeout); becomes an observation for the model."""

    def __init__(self, message: str, kind: str = "error") -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind  # "validation" | "exception" | "timeout" | "unknown_tool"


class ParseError(AgentError):
    """The model's output is not a valid action; becomes an observation for the model."""
