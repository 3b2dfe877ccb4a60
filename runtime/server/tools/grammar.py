"""The llguidance (Lark) grammar that makes tool calls valid by construction.

- `required` / a named tool: the output is exactly a block of calls (one call unless parallel calls
  are allowed); each call's arguments match that tool's JSON schema.
- `auto`: free text that never contains the format's trigger, OR (optionally some text, then) a block
  of calls held to the same schemas. With a JSON `response_format`, the free-text branch is that JSON.
- `none`: free text that never contains the trigger (the model cannot start a call).

JSON inside calls is compact with keys in sorted order (the schemas are re-serialized with sorted
keys), so the text the model writes equals `canonical_json` of its parsed arguments: a client that
parses and re-serializes the arguments still sends back bytes the prefix cache has seen.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from runtime.server.tools.formats import ToolFormat

_REGEX_META = set("\\.+*?()|[]{}^$#&-~/")


def _lit(text: str) -> str:
    """A Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def _regex_escape(text: str) -> str:
    """`text` as a literal inside /.../ (Rust regex syntax; `<` must stay unescaped: `\\<` is a word
    boundary there)."""
    out = []
    for ch in text:
        if ch == "\n":
            out.append("\\n")
        elif ch in _REGEX_META:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def _rebase_refs(node: object, base: str) -> object:
    """Point local `$ref`s (`#...`) of a tool's schema at its new home `base` in the merged schema."""
    if isinstance(node, dict):
        return {
            k: (
                base + v[1:]
                if k == "$ref" and isinstance(v, str) and v.startswith("#")
                else _rebase_refs(v, base)
            )
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_rebase_refs(v, base) for v in node]
    return node


def call_schema(tools: Sequence[tuple[str, dict[str, object]]], args_key: str) -> dict[str, object]:
    """One JSON schema for `{"name": N, args_key: ARGS}` over all `(name, parameters)` given."""
    options, defs = [], {}
    for i, (name, params) in enumerate(tools):
        key = f"tool{i}"
        defs[key] = _rebase_refs(json.loads(json.dumps(params, sort_keys=True)), f"#/$defs/{key}")
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": name}, args_key: {"$ref": f"#/$defs/{key}"}},
                "required": ["name", args_key],
                "additionalProperties": False,
            }
        )
    root: dict[str, object] = options[0] if len(options) == 1 else {"anyOf": options}
    return {**root, "$defs": defs, "x-guidance": {"whitespace_flexible": False}}


def _block(fmt: ToolFormat, call_rule: str, parallel: bool, opened: bool) -> str:
    """Lark expression of a block of calls; `opened`: the trigger was already matched."""
    one = " ".join(x for x in (call_rule, _lit(fmt.call_close) if fmt.call_close else "") if x)
    parts = (
        [] if opened else [_lit(fmt.begin) if fmt.begin else "", _lit(fmt.call_open) if fmt.call_open else ""]
    )
    parts.append(one)
    if parallel:
        again = " ".join(
            x for x in (_lit(fmt.sep) if fmt.sep else "", _lit(fmt.call_open) if fmt.call_open else "") if x
        )
        parts.append(f"({again} {one})*")
    if fmt.end:
        parts.append(_lit(fmt.end))
    return " ".join(p for p in parts if p)


def build(
    fmt: ToolFormat,
    choice: str,
    tools: Sequence[tuple[str, dict[str, object]]],
    parallel: bool,
    text_schema: dict[str, object] | None = None,
    begin_token: bool = False,
) -> str:
    """The Lark grammar for `choice` in none | auto | required (a named tool: pass only that tool and
    `required`). `begin_token`: the format's `begin` is one special token of the model's
    tokenizer (Llama 3's `<|python_tag|>`), which no text can contain: free text needs no
    exclusion and a call block starts at the token (runtime/engine/grammar.py writes it as `<[id]>`)."""
    if begin_token and fmt.begin and choice == "auto" and text_schema is None:
        call = "call: %json " + json.dumps(call_schema(tools, fmt.args_key), ensure_ascii=False)
        block = _block(fmt, "call", parallel, opened=False)
        return f"start: TEXT | TEXT? {block}\nTEXT: /(.|\\n)+/\n{call}\n"
    trig = _regex_escape(fmt.trigger)
    text_rule = f"TEXT: /(.|\\n)*/ & ~/(.|\\n)*{trig}(.|\\n)*/"
    if choice == "none":
        return f"start: TEXT\n{text_rule}\n"
    call = "call: %json " + json.dumps(call_schema(tools, fmt.args_key), ensure_ascii=False)
    if choice == "required":
        return f"start: {_block(fmt, 'call', parallel, opened=False)}\n{call}\n"
    if text_schema is not None:
        # the JSON answer or a block of calls from the first byte (a lazy free-text prefix beside
        # a JSON lexeme leaves llguidance never accepting the JSON)
        schema = {**text_schema, "x-guidance": {"whitespace_flexible": False}}
        lines = [
            f"start: text | {_block(fmt, 'call', parallel, opened=False)}",
            "text: %json " + json.dumps(schema),
        ]
        return "\n".join([*lines, call]) + "\n"
    lines = [f"start: text | pre {_block(fmt, 'call', parallel, opened=True)}", "text: TEXT", text_rule]
    # lazy: the free text before a call ends at the first trigger, which it includes
    lines += [f"pre[lazy]: /(.|\\n)*{trig}/", call]
    return "\n".join(lines) + "\n"
