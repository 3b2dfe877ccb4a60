"""The agent layer's one frozen config, validated once."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Loop policy. `reflect`: False = never; True = after failures; k > 0 = also every k calls."""

    max_steps: int = 12
    reflect: bool | int = True
    max_backtracks: int = 2
    max_errors: int = 3  # consecutive failed actions before the branch is abandoned
    dead_end: bool = True  # let the model declare a dead end (triggers a rollback)
    fork_temperature: float = 0.7
    #: "auto" | "required" | "none" | a tool name: see agent/choice.py (the Agent checks the name)
    tool_choice: str = "auto"
    #: numeric tool arguments take a number written in the run so far (system, task, results)
    ground_numbers: bool = True
    sampling: dict[str, object] = field(default_factory=lambda: {"temperature": 0.0, "max_new_tokens": 256})
    #: earlier turns' thinking blocks: "preserve" keeps each turn as generated (the prefix cache
    #: reuses it whole); "template" drops them once a new user message follows, as Qwen3's chat
    #: template does (the trace then counts the lost tokens as `template_rewrite`)
    reasoning_history: str = "preserve"

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError("max_steps must be >= 1")
        if not isinstance(self.reflect, bool) and self.reflect < 1:
            raise ValueError("reflect must be a bool or a step interval >= 1")
        if self.max_backtracks < 0 or self.max_errors < 1:
            raise ValueError("max_backtracks must be >= 0 and max_errors >= 1")
        if self.fork_temperature <= 0:
            raise ValueError("fork_temperature must be > 0 (greedy branches would be identical)")
        if not isinstance(self.tool_choice, str) or not self.tool_choice:
            raise ValueError("tool_choice must be 'auto', 'required', 'none' or a tool name")
        if self.reasoning_history not in ("preserve", "template"):
            raise ValueError("reasoning_history must be 'preserve' or 'template'")
        if "json_schema" in self.sampling or "regex" in self.sampling:
            raise ValueError("the agent sets json_schema itself; do not pass it in sampling")

    @property
    def reflect_every(self) -> int | None:
        return None if isinstance(self.reflect, bool) else int(self.reflect)

    @property
    def reflect_on_failure(self) -> bool:
        return self.reflect is not False
