"""Tools and tool-using history in the prompt, rendered so that every turn extends the previous one.

Fallback (the chat template does not take `tools`, as the bundled SmolLM2's): the definitions go
into the system turn as a fixed block (`tools_block`), one JSON object per tool with sorted keys and
no spaces; the block does not depend on `tool_choice` or `parallel_tool_calls`, so a client that
changes those between turns keeps its cached head. An assistant message with `tool_calls` is
rendered as the model wrote it: from `CallMemo` (the exact output text, when the client sends the
calls back unchanged) or else in the format's canonical form, which is what the grammar makes the
model write. Consecutive `role: "tool"` messages become one user turn of `<tool_response>` blocks.

A chat template that takes `tools` gets them (same sorted definitions) and the OpenAI-shaped history
(arguments as objects); its own rendering decides byte stability then.
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.server.errors import ApiError
from runtime.server.tools.calls import Tool
from runtime.server.tools.formats import RawCall, ToolFormat, canonical_json
from runtime.server.turn_records import captured


def tools_block(tools: tuple[Tool, ...], fmt: ToolFormat) -> str:
    lines = "\n".join(canonical_json(t.definition()) for t in tools)
    example = fmt.render_calls([RawCall("<function-name>", "<arguments-json-object>")])
    return (
        "# Tools\n\nYou may call one or more functions to help with the request. "
        f"The functions, one JSON definition per line:\n<tools>\n{lines}\n</tools>\n\n"
        f"To call functions, answer with this and nothing after it:\n{example}"
    )


@dataclass(frozen=True, slots=True)
class _Memo:
    text: str  # the full output text of the turn (content, then the calls)
    content: str
    calls: tuple[tuple[str, str], ...]  # (name, canonical arguments)
    output_ids: tuple[int, ...] | None  # the generated tokens, when they decode to exactly `text`


@dataclass(frozen=True, slots=True)
class Hit:
    """An assistant turn rendered from the memo: its text and the tokens the model generated."""

    text: str
    output_ids: tuple[int, ...] | None


class CallMemo:
    """Exact output texts of recent tool-calling turns, by their first call id (bounded, LRU)."""

    def __init__(self, capacity: int = 4096) -> None:
        self._items: OrderedDict[str, _Memo] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()

    def record(
        self,
        ids: list[str],
        text: str,
        content: str | None,
        calls: tuple[RawCall, ...],
        output_ids: tuple[int, ...] | None = None,
    ) -> None:
        if not ids:
            return
        key = tuple((c.name, _canonical_args(c.arguments)) for c in calls)
        with self._lock:
            self._items[ids[0]] = _Memo(text, (content or "").strip(), key, output_ids)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)
        captured(functools.partial(self.record, ids, text, content, calls, output_ids), text, output_ids)

    def lookup(self, first_id: str, content: str, calls: tuple[tuple[str, str], ...]) -> Hit | None:
        with self._lock:
            memo = self._items.get(first_id)
            if memo is not None:
                self._items.move_to_end(first_id)
        if memo is None or memo.calls != calls or memo.content != content.strip():
            return None
        return Hit(memo.text, memo.output_ids)


def _canonical_args(arguments: str) -> str:
    try:
        return canonical_json(json.loads(arguments))
    except ValueError:
        return arguments


def _history_calls(index: int, calls: list[dict[str, Any]]) -> tuple[list[str], tuple[tuple[str, str], ...]]:
    """(ids, (name, canonical arguments) per call) of an assistant message's `tool_calls`."""
    ids, out = [], []
    for j, call in enumerate(calls):
        where = f"messages.{index}.tool_calls.{j}"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ApiError(400, f"{where}.function.name: required (a string)")
        args = fn.get("arguments", "{}")
        try:
            if isinstance(args, str):
                args = json.loads(args) if args.strip() else {}
            if not isinstance(args, dict):
                raise ApiError(400, f"{where}.function.arguments: must be a JSON object")
            text = canonical_json(args)
        except (ValueError, RecursionError) as exc:
            raise ApiError(400, f"{where}.function.arguments: not valid JSON ({type(exc).__name__})") from exc
        ids.append(str(call.get("id", "")))
        out.append((fn["name"], text))
    return ids, tuple(out)


def _assistant_text(
    index: int, message: dict[str, Any], fmt: ToolFormat, memo: CallMemo, hits: list[Hit] | None
) -> str:
    content = message.get("content") or ""
    ids, calls = _history_calls(index, message["tool_calls"])
    exact = memo.lookup(ids[0], content, calls) if ids else None
    if exact is not None:
        if hits is not None:
            hits.append(exact)
        return exact.text
    block = fmt.render_calls([RawCall(name, args) for name, args in calls])
    return f"{content}\n{block}" if content else block


def fallback_messages(
    messages: list[dict[str, Any]],
    tools: tuple[Tool, ...],
    fmt: ToolFormat,
    memo: CallMemo,
    hits: list[Hit] | None = None,
) -> list[dict[str, Any]]:
    """Template-ready `{role, content}` messages for a template without tool support; assistant
    turns restored from the memo are appended to `hits`, in order."""
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        role = msg["role"]
        if role == "tool":
            text = fmt.render_response(msg.get("content") or "")
            if out and out[-1].get("_tool_turn"):
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text, "_tool_turn": True})
            continue
        if role == "assistant" and msg.get("tool_calls"):
            out.append({"role": "assistant", "content": _assistant_text(i, msg, fmt, memo, hits)})
            continue
        out.append({"role": role, "content": msg.get("content") or ""})
    for msg in out:
        msg.pop("_tool_turn", None)
    if tools:
        block = tools_block(tools, fmt)
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def splice_ids(text: str, hits: list[Hit], tokenize: Callable[[str], list[int]]) -> list[int] | None:
    """The prompt's tokens with each memo-restored turn as the very tokens the model generated.

    Re-tokenizing generated text can split it differently (`"}` + `}` generated, `"` + `}}` on
    re-tokenizing), and the prefix cache matches tokens, not bytes. None: nothing to splice.
    """
    ids: list[int] = []
    pos = 0
    for hit in hits:
        at = text.find(hit.text, pos)
        if hit.output_ids is None or at < 0:
            continue
        ids += tokenize(text[pos:at]) + list(hit.output_ids)
        pos = at + len(hit.text)
    if pos == 0:
        return None
    return ids + tokenize(text[pos:])


def template_takes_tools(tokenizer: object) -> bool:
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template


def native_messages(messages: list[dict[str, Any]]) -> list[dict[str, object]]:
    """OpenAI history for a template with tool support: arguments as objects (HF's convention)."""
    out = []
    for i, msg in enumerate(messages):
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            ids, calls = _history_calls(i, msg["tool_calls"])
            msg = {
                **msg,
                "tool_calls": [
                    {"id": cid, "type": "function", "function": {"name": name, "arguments": json.loads(args)}}
                    for cid, (name, args) in zip(ids, calls, strict=True)
                ],
            }
        out.append(msg)
    return out
