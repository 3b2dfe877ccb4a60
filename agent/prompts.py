"""Every piece of prompt text the agent writes, in one place (ChatML, SmolLM2/Qwen style).

Nothing here may contain timestamps, random ids or unordered collections: a prompt is a pure
function of the agent's configuration and its step log, so each one extends the previous.
"""

from __future__ import annotations

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

MESSAGE = IM_START + "{role}\n{content}" + IM_END + "\n"
GENERATION_PROMPT = IM_START + "assistant\n"
ASSISTANT_CLOSE = IM_END + "\n"
#: a reasoning model's thinking block (Qwen3, DeepSeek-R1); see AgentConfig.reasoning_history
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

PROTOCOL = (
    "Reply with exactly one JSON object and nothing else:\n"
    '- to call a tool: {{"tool": NAME, "arguments": {{...}}}}\n'
    '- to give the final answer: {{"answer": TEXT}}'
    "{dead_end}"
)
DEAD_END_LINE = '\n- if this path cannot succeed: {"dead_end": REASON}'

TOOLS_SECTION = "\n\n## Tools\n{tools}"
DOCUMENTS_SECTION = "\n\n## Documents"
DOCUMENT = "\n\n### Document {index}: {title}\n{text}"

TASK = "{task}"
OBSERVATION = "Observation [{call_id}]: {content}\nIf this answers the task, reply with the final answer."
TOOL_ERROR = "Error [{call_id}] ({kind}): {message}"
PARSE_ERROR = "Error: your reply was not a valid action ({message}). Reply with one JSON object."
REFLECT = (
    "Reflect: in one or two sentences, say what went wrong or what is missing so far and what "
    'to do next. Reply as {"thought": TEXT}.'
)
REJECTED = "A previous attempt answered {answer!r}; it was rejected ({reason}). Try a different approach."
DEAD_END_NOTE = "A previous attempt reached a dead end ({reason}). Try a different approach."
REPEATED_ERRORS_NOTE = "A previous attempt failed {count} times in a row ({last}). Try a different approach."
VERIFY_FAILED = "Your answer {answer!r} was rejected ({reason})."
