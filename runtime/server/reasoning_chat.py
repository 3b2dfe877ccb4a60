"""The chat route's reasoning steps (one `ReasoningChat` per server): the prompt with earlier
turns as generated (runtime/server/reasoning_history.py), the grammar after the thinking block,
`message.reasoning_content` / `delta.reasoning_content` (runtime/server/reasoning.py), and the
memo of generated turns. Without `--reasoning-parser` only the history part runs: any template
that rewrites earlier turns (or drops `reasoning_content`) is handled the same way."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.server.errors import ApiError
from runtime.server.reasoning import ReasoningParser, ReasoningStream, parser_for
from runtime.server.reasoning_history import (
    TEMPLATE_REWRITES,
    Span,
    Turn,
    TurnMemo,
    restore,
    rewrites,
    substitute,
    turn_key,
)
from runtime.server.schemas import ChatCompletionRequest
from runtime.server.state import ServerState
from runtime.server.tools.calls import ToolPlan, split_output
from runtime.server.tools.chat import ToolCalling, exact_ids
from runtime.server.tools.prompt import Hit


@dataclass(frozen=True, slots=True)
class Prompt:
    """A rendered chat prompt: its text, its tokens where restored turns fix them, the text the
    template appended as the generation prompt, and whether that leaves a thinking block open."""

    text: str
    ids: list[int] | None
    gen_prompt: str
    opened: bool
    salt: str | None = None  # the request's cache salt: the memo is kept per salt


class ReasoningChat:
    def __init__(self, state: ServerState, tools: ToolCalling) -> None:
        self.state, self.tools = state, tools
        args = state.args
        self.parser: ReasoningParser | None = parser_for(getattr(args, "reasoning_parser", None))
        self.preserve = getattr(args, "reasoning_history", "preserve") == "preserve"
        self.memo = TurnMemo()

    def effort(self, effort: str | None, template_kwargs: dict[str, object]) -> dict[str, object]:
        """OpenAI's `reasoning_effort` as this server's reasoning control: none/minimal turn thinking
        off (`enable_thinking: false` where the template takes it; a model that does not think is
        already there), low/medium/high turn it on (there is no token budget per level), which needs
        a thinking model (--reasoning-parser). An explicit enable_thinking that disagrees is a 400."""
        if effort is None:
            return template_kwargs
        on = effort not in ("none", "minimal")
        if on and self.parser is None:
            raise ApiError(
                400,
                f"reasoning_effort: {effort!r} needs a reasoning model (--reasoning-parser); send none or omit it",
            )
        explicit = template_kwargs.get("enable_thinking")
        if explicit is not None and explicit is not on:
            raise ApiError(
                400, f"reasoning_effort {effort!r} contradicts chat_template_kwargs.enable_thinking"
            )
        if not self._template_thinks():
            return template_kwargs
        return {**template_kwargs, "enable_thinking": on}

    def _template_thinks(self) -> bool:
        template = getattr(self.state.engine.tokenizer, "chat_template", None)
        return isinstance(template, str) and "enable_thinking" in template

    def check(self, req: ChatCompletionRequest, template_kwargs: dict[str, object]) -> None:
        """`enable_thinking: true` needs a template that takes it (false asks for nothing)."""
        if template_kwargs.get("enable_thinking") is True:
            template = getattr(self.state.engine.tokenizer, "chat_template", None)
            if not isinstance(template, str) or "enable_thinking" not in template:
                raise ApiError(
                    400, "chat_template_kwargs.enable_thinking: this model's chat template does not take it"
                )

    async def prompt(
        self,
        messages: list[dict[str, object]],
        plan: ToolPlan | None,
        template_kwargs: dict[str, object],
        salt: str | None = None,
    ) -> Prompt:
        marks: dict[str, Turn] = {}
        rendered = messages
        if self.preserve:
            rendered, marks = substitute(messages, self.memo, self.parser, salt)
        text, hits = await self._render(rendered, plan, template_kwargs, True)
        bare, _ = await self._render(rendered, plan, template_kwargs, False)
        gen_prompt = text[len(bare) :] if text.startswith(bare) else ""
        text, spans = restore(text, marks)
        spans = _merge(text, spans, hits)
        ids = None
        if any(s.output_ids is not None for s in spans):
            ids = await self.state.bridge.call(_splice, text, spans, self.state.engine.tokenize)
        TEMPLATE_REWRITES.set(rewrites(messages, text, self.memo, self.parser, salt))
        opened = self.parser is not None and self.parser.opened(text)
        return Prompt(text, ids, gen_prompt, opened, salt)

    async def _render(
        self,
        messages: list[dict[str, object]],
        plan: ToolPlan | None,
        kwargs: dict[str, object],
        generation: bool,
    ) -> tuple[str, list[Hit]]:
        if plan is not None or self.tools.touches_tools(messages):
            return await self.tools.prompt(messages, plan, kwargs, generation)
        engine = self.state.engine
        text = await self.state.bridge.call(
            engine.apply_chat_template, messages, add_generation_prompt=generation, **kwargs
        )
        return text, []

    def thinking(self, template_kwargs: dict[str, Any]) -> bool:
        return self.parser is not None and template_kwargs.get("enable_thinking") is not False

    def constrain(self, sampling: dict[str, Any], prompt: Prompt, template_kwargs: dict[str, Any]) -> dict:
        """A constraint applies after the thinking block while the model may think."""
        if self.parser is None or not self.thinking(template_kwargs):
            return sampling
        if "ebnf" in sampling:
            raise ApiError(
                400,
                "ebnf: cannot follow a thinking block under --reasoning-parser; send regex or "
                "json_schema, or chat_template_kwargs.enable_thinking: false",
            )
        tags = self.parser.tag_ids(self.state.engine.tokenizer)
        return self.parser.constraint(sampling, prompt.opened, tags)

    def shape(self, body: dict[str, Any], prompt: Prompt, separate: bool) -> None:
        """`message.reasoning_content` apart from `content` (in place), as SGLang returns them."""
        if self.parser is None or not separate:
            return
        for choice in body["choices"]:
            message = choice["message"]
            split = self.parser.split(message["content"] or "", prompt.opened)
            message["reasoning_content"] = split.reasoning
            message["content"] = split.content

    def streamer(self, prompt: Prompt, separate: bool) -> ReasoningStream | None:
        return self.parser.stream(prompt.opened) if self.parser is not None and separate else None

    def record(self, outs: list[dict[str, Any]], prompt: Prompt) -> None:
        """Remember each output's turn under every form a client sends it back in: raw text;
        reasoning apart from content; content and parsed tool calls."""
        for out in outs:
            text = out.get("text") or ""
            turn = Turn(text, exact_ids(self.state.engine, out), prompt.gen_prompt)
            reasoning, content = None, text
            if self.parser is not None:
                split = self.parser.split(text, prompt.opened)
                reasoning, content = split.reasoning, split.content
            keys = {
                turn_key({"content": text}, None, prompt.salt),
                turn_key({"content": content, "reasoning_content": reasoning}, None, prompt.salt),
            }
            parsed = self.tools.fmt.parse(content)
            if parsed.calls and parsed.complete:
                calls = [{"function": {"name": c.name, "arguments": c.arguments}} for c in parsed.calls]
                before = split_output(parsed)[0] or ""
                keys.add(
                    turn_key(
                        {"content": before, "reasoning_content": reasoning, "tool_calls": calls},
                        None,
                        prompt.salt,
                    )
                )
            self.memo.record(sorted(keys), turn)


def _merge(text: str, spans: list[Span], hits: list[Hit]) -> list[Span]:
    """Restored spans plus the tool memo's hits (found in order in the final text)."""
    out, pos = list(spans), 0
    for hit in hits:
        at = text.find(hit.text, pos)
        if at < 0:
            continue
        if not any(s.start <= at < s.end for s in spans):
            out.append(Span(at, at + len(hit.text), hit.output_ids))
        pos = at + len(hit.text)
    return sorted(out, key=lambda s: s.start)


def _splice(text: str, spans: list[Span], tokenize: Callable[[str], list[int]]) -> list[int]:
    """The prompt's tokens: text between spans tokenized, each span as its generated tokens."""
    ids: list[int] = []
    pos = 0
    for s in spans:
        if s.output_ids is None or s.start < pos:
            continue
        ids += tokenize(text[pos : s.start]) + list(s.output_ids)
        pos = s.end
    return ids + tokenize(text[pos:])
