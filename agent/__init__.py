"""radixagent's agent SDK: tools, byte-stable prompt layout, checkpoints/forks, per-step trace."""

from __future__ import annotations

from agent.actions import Action, action_schema, parse_action
from agent.agent import Agent
from agent.checkpoints import Checkpoint, ForkResult, RunResult, RunStatus, Step
from agent.config import AgentConfig
from agent.errors import AgentError, ParseError, ToolError
from agent.examples import Example, ExampleCall
from agent.layout import Prompt, PromptLayout
from agent.run import Run
from agent.tools import Tool, ToolResult, canonical_json, tool
from agent.trace import PrefixBreakWarning, SessionLedger, StepRecord, TraceWriter, read_trace

__all__ = [
    "Action",
    "Agent",
    "AgentConfig",
    "AgentError",
    "Checkpoint",
    "Example",
    "ExampleCall",
    "ForkResult",
    "ParseError",
    "PrefixBreakWarning",
    "Prompt",
    "PromptLayout",
    "Run",
    "RunResult",
    "RunStatus",
    "SessionLedger",
    "Step",
    "StepRecord",
    "Tool",
    "ToolError",
    "ToolResult",
    "TraceWriter",
    "action_schema",
    "canonical_json",
    "parse_action",
    "read_trace",
    "tool",
]
