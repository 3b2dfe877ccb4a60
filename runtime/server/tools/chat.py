"""The chat route's tool-calling steps (one `ToolCalling` per server): plan, prompt, constraint,
response shaping and streaming. See calls.py for the contract."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

from runtime.engine.engine import Engine
from runtime.server.bridge import SSE_DONE, close_stream, sse, sse_error
from runtime.server.errors import ApiError
from runtime.server.openai_usage import finish_of, usage
from runtime.server.reasoning import REASONING, ReasoningStream
from runtime.server.schemas import ChatCompletionRequest, _OpenAIBase
from runtime.server.state import ServerState
from runtime.server.tools.calls import ToolPlan, aplan, new_call_id, openai_calls, split_output
from runtime.server.tools.formats import DEFAULT_FORMAT, FORMATS
from runtime.server.tools.prompt import (
    CallMemo,
    Hit,
    fallback_messages,
    native_messages,
    template_takes_tools,
    tools_block,
)
from runtime.server.tools.stream import ArgsDelta, CallStart, CallStreamer, Content, Event


class ChatCall(Protocol):
    """What a tool stream needs of the OpenAI route's per-request shaping (openai_api's `_Call`,
    which imports this module: a protocol instead of an import cycle)."""

    @property
    def req(self) -> _OpenAIBase: ...

    on_done: Callable[[list[dict[str, object]]], None] | None

    def _envelope(self, object_: str, choices: list[dict[str, object]]) -> dict[str, Any]: ...

    def _with_usage(self, body: dict[str, object], meta: dict[str, object]) -> dict[str, object]: ...


class ToolCalling:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.fmt = FORMATS[getattr(state.args, "tool_call_parser", DEFAULT_FORMAT)]
        self.memo = CallMemo()

    async def plan(self, req: ChatCompletionRequest) -> ToolPlan | None:
        """The request's tool plan (400 on bad tools / choice / combinations), None without tools."""
        p = await aplan(req.tools, req.tool_choice, req.parallel_tool_calls, self.fmt)
        if p is not None and p.may_call:
            for name in ("regex", "json_schema", "ebnf"):
                if getattr(req, name) is not None:
                    raise ApiError(
                        400,
                        f"{name}: cannot be combined with tools (tool_choice {p.choice!r}); "
                        "use response_format or tool_choice 'none'",
                    )
        return p

    @staticmethod
    def touches_tools(messages: list[dict[str, object]]) -> bool:
        return any(m.get("tool_calls") or m["role"] == "tool" for m in messages)

    @staticmethod
    def check_streamable(req: ChatCompletionRequest) -> None:
        """Streamed tool calls come as one choice without logprobs: refuse what the stream can't carry."""
        if req.n > 1:
            raise ApiError(400, "n: streamed tool calls support n=1 only (stream=false takes n > 1)")
        if req.logprobs:
            raise ApiError(400, "logprobs: not available on streamed tool calls (stream=false returns them)")

    async def prompt(
        self,
        messages: list[dict[str, object]],
        p: ToolPlan | None,
        template_kwargs: dict[str, object] | None = None,
        generation: bool = True,
    ) -> tuple[str, list[Hit]]:
        """The prompt text and the earlier tool-call turns restored from the memo, in order (their
        tokens as generated: `splice_ids` makes the prompt's tokens, what the cache holds).
        `generation`: end with the template's generation prompt."""
        tools = p.tools if p is not None else ()
        engine = self.state.engine
        tokenizer = engine.tokenizer
        if tokenizer is not None and template_takes_tools(tokenizer):
            defs = [json.loads(json.dumps(t.definition(), sort_keys=True)) for t in tools] or None
            text = await self.state.bridge.call(
                tokenizer.apply_chat_template,
                native_messages(messages),
                tools=defs,
                tokenize=False,
                add_generation_prompt=generation,
                **(template_kwargs or {}),
            )
            return text, []
        hits: list[Hit] = []
        rendered = fallback_messages(messages, tools, self.fmt, self.memo, hits)
        text = await self.state.bridge.call(
            engine.apply_chat_template, rendered, add_generation_prompt=generation, **(template_kwargs or {})
        )
        return text, hits

    def constrain(
        self, sampling: Mapping[str, Any], req: ChatCompletionRequest, p: ToolPlan
    ) -> dict[str, object]:
        """`sampling` with the plan's grammar (a JSON response_format joins it under `auto`)."""
        out = dict(sampling)
        text_schema = None
        if p.may_call and p.choice == "auto" and "json_schema" in out:
            text_schema = json.loads(out["json_schema"])
        if not p.may_call and ("json_schema" in out or "regex" in out):
            return out  # the request's own constraint alone: it already decides what the text may be
        out.pop("json_schema", None)
        begin_token = self._special(self.fmt.begin)
        out["lark"] = p.grammar(text_schema if p.may_call else None, begin_token)
        return out

    def _special(self, text: str) -> bool:
        """Whether `text` is one special token of the served model's tokenizer."""
        added = getattr(self.state.engine.tokenizer, "added_tokens_decoder", None) or {}
        return bool(text) and any(t.special and t.content == text for t in added.values())

    def shape(self, body: dict[str, Any], outs: list[dict[str, Any]], p: ToolPlan) -> None:
        """Split each choice's text into content and tool_calls (in place)."""
        if not p.may_call:
            return
        for choice, out in zip(body["choices"], outs, strict=True):
            # the content: the output after any thinking block the reasoning parser took out
            parsed = self.fmt.parse(choice["message"]["content"] or "")
            content, has_calls = split_output(parsed)
            if not has_calls:
                # a call cut off before it closed is never text; under `required` all output is a call
                if p.choice == "required" or p.forced is not None:
                    choice["message"]["content"] = None
                elif not parsed.complete:
                    choice["message"]["content"] = parsed.content or None
                continue
            ids = [new_call_id() for _ in parsed.calls]
            choice["message"]["content"] = content
            choice["message"]["tool_calls"] = openai_calls(parsed.calls, ids)
            if parsed.complete:
                choice["finish_reason"] = "tool_calls"
                self.memo.record(ids, out["text"], content, parsed.calls, exact_ids(self.state.engine, out))

    async def stream(
        self,
        call: ChatCall,
        chunks: AsyncIterator[dict[str, Any]],
        p: ToolPlan,
        thinking: ReasoningStream | None = None,
    ) -> AsyncIterator[bytes]:
        """OpenAI chat chunks with `delta.tool_calls`; ends with the finish chunk, usage, [DONE].
        `thinking`: the reasoning parser's splitter; its reasoning goes out as
        `delta.reasoning_content`, and calls are read from the content after it."""
        streamer = CallStreamer(self.fmt)
        ids: list[str] = []
        last: dict[str, Any] | None = None
        try:
            yield sse(_chunk(call, {"role": "assistant", "content": ""}))
            async for chunk in chunks:
                last = chunk
                for delta in self._step(streamer, thinking, chunk.get("text", ""), ids):
                    yield sse(call._with_usage(_chunk(call, delta), chunk.get("meta_info", {})))
            for delta in self._step(streamer, thinking, (last or {}).get("text", ""), ids, done=True):
                yield sse(call._with_usage(_chunk(call, delta), (last or {}).get("meta_info", {})))
        except Exception as exc:  # headers already sent: report in-band
            last = None
            yield sse_error(exc)
        finally:
            await close_stream(chunks)
        if last is not None:
            if call.on_done is not None:
                call.on_done([last])
            text = last.get("text", "")
            content = text if thinking is None else thinking.parser.split(text, thinking.opened).content
            for event in self._tail(call, last, ids, content):
                yield event
        yield SSE_DONE

    @staticmethod
    def _step(
        streamer: CallStreamer,
        thinking: ReasoningStream | None,
        text: str,
        ids: list[str],
        done: bool = False,
    ) -> list[dict[str, object]]:
        """The deltas of one engine chunk (cumulative `text`): reasoning first, then content / calls."""
        if thinking is None:
            return _deltas(streamer.finish() if done else streamer.feed(text), ids)
        pieces = thinking.finish(text) if done else thinking.feed(text)
        out: list[dict[str, object]] = [{"reasoning_content": t} for kind, t in pieces if kind == REASONING]
        content = "".join(t for kind, t in pieces if kind != REASONING)
        if content or done:
            events = streamer.feed(streamer.text + content)
            out += _deltas(events + streamer.finish() if done else events, ids)
        return out

    def _tail(self, call: ChatCall, last: dict[str, Any], ids: list[str], content: str) -> list[bytes]:
        meta = last.get("meta_info", {})
        self.state.observe("openai", last, stream=True)
        reason = finish_of(meta)[0]
        parsed = self.fmt.parse(content)
        if ids and parsed.complete and len(parsed.calls) == len(ids):
            reason = "tool_calls"
            self.memo.record(
                ids,
                last.get("text", ""),
                split_output(parsed)[0],
                parsed.calls,
                exact_ids(self.state.engine, last),
            )
        events = [sse(_chunk(call, {}, reason))]
        if call.req.include_usage:
            body = call._envelope("chat.completion.chunk", [])
            body["usage"] = usage([meta])
            events.append(sse(body))
        return events


def exact_ids(engine: Engine, out: dict[str, Any]) -> tuple[int, ...] | None:
    """The output's tokens without a final stop token, if they decode to exactly its text (with
    special tokens skipped, as the text is detokenized by default: Llama 3's `<|python_tag|>`)."""
    ids = list(out.get("output_ids") or [])
    matched = (out.get("meta_info", {}).get("finish_reason") or {}).get("matched")
    if ids and isinstance(matched, int) and ids[-1] == matched:
        ids.pop()
    decode = engine.decode
    if not ids:
        return None
    text = out.get("text")
    if decode(ids) == text or decode(ids, skip_special_tokens=True) == text:
        return tuple(ids)
    return None


def _deltas(events: list[Event], ids: list[str]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for e in events:
        if isinstance(e, Content):
            out.append({"content": e.text})
        elif isinstance(e, CallStart):
            ids.append(new_call_id())
            fn = {"name": e.name, "arguments": ""}
            out.append(
                {"tool_calls": [{"index": e.index, "id": ids[-1], "type": "function", "function": fn}]}
            )
        elif isinstance(e, ArgsDelta):
            out.append({"tool_calls": [{"index": e.index, "function": {"arguments": e.text}}]})
    return out


def _chunk(call: ChatCall, delta: dict[str, object], reason: str | None = None) -> dict[str, object]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
    return call._envelope("chat.completion.chunk", [choice])


__all__ = ["ToolCalling", "tools_block"]
