"""Grammar constraints that keep a small model's tool arguments and answers sensible.

Everything here builds plain regexes (the dialect every grammar backend shares: no look-around,
no back-references) for JSON-schema `pattern`s, so the same action schema works on the embedded
engine (llguidance) and on SGLang servers (xgrammar / llguidance / outlines).

- `guard_arguments`: free-text string arguments may not be empty, start with a space, or be a
  bare copy of a name from the prompt's tool list (a weak model's favourite degenerate value:
  `search_document({"query": "search_document"})`).
- `span_pattern`: an answer that is a verbatim span of some evidence text (extractive answers).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

_META = set(r"\.^$|?*+()[]{}-&~#/\"")
_CLASS_META = set("\\]^-[&~")
#: one word of a span: what `span_words` keeps (letters, digits, inner punctuation)
_WORD = re.compile(r"[^\s\"\\]+")
_EDGE_PUNCT = ".,;:!?()[]'\u2018\u2019\u201c\u201d"


def escape(text: str) -> str:
    """Escape `text` for a regex (only real meta characters: some dialects reject `\\ `)."""
    return "".join("\\" + ch if ch in _META else ch for ch in text)


def _class_char(ch: str) -> str:
    return "\\" + ch if ch in _CLASS_META else ch


#: a character trie: "" marks the end of a word
_CharTrie = dict[str, "_CharTrie"]


def not_words_pattern(words: Iterable[str]) -> str:
    """Anchored regex of non-empty strings that start with a non-space and equal none of `words`
    (case-insensitive)."""
    trie: _CharTrie = {}
    for word in sorted({w.lower() for w in words if w}):  # sorted: one pattern whatever the hash seed
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}  # end marker
    return "^" + _complement(trie, first=True) + "$"


def _cased(ch: str) -> list[str]:
    return sorted({ch, ch.upper(), ch.lower()})


def _complement(node: _CharTrie, first: bool = False) -> str:
    """Strings that, appended to this trie node's prefix, give a string outside the word set."""
    children = sorted(ch for ch in node if ch)
    excluded = "".join(_class_char(c) for ch in children for c in _cased(ch))
    head = f"[^{excluded}\\s]" if first else (f"[^{excluded}]" if excluded else ".")
    options = [head + ".*"]
    for ch in children:
        chars = _cased(ch)
        atom = escape(chars[0]) if len(chars) == 1 else "[" + "".join(_class_char(c) for c in chars) + "]"
        options.append(atom + _complement(node[ch]))
    if not first and "" not in node:
        options.append("")  # this prefix itself is not a forbidden word
    return "(" + "|".join(options) + ")"


def _free_string(schema: dict[str, object]) -> bool:
    return schema.get("type") == "string" and not ({"enum", "const", "pattern", "format"} & schema.keys())


def guard_arguments(parameters: dict[str, object], forbidden: Sequence[str]) -> dict[str, object]:
    """A copy of a tool's arguments schema whose free-text strings refuse degenerate values.

    Strings that already carry an enum, const, pattern or format are the tool author's choice and
    stay as they are; so do non-string arguments.
    """
    properties = parameters.get("properties")
    if not isinstance(properties, dict):
        return parameters
    pattern = not_words_pattern([*forbidden, *properties])
    guarded = {}
    for name, schema in properties.items():
        if isinstance(schema, dict) and _free_string(schema):
            schema = {**schema, "pattern": pattern}
        guarded[name] = schema
    return {**parameters, "properties": guarded}


def forbidden_names(tool_names: Sequence[str]) -> list[str]:
    """Names a free-text argument must not just repeat: each tool's name, also with spaces."""
    return sorted({v for n in tool_names for v in (n, n.replace("_", " "), n.replace("_", ""))})


def span_words(text: str) -> list[str]:
    """The words of `text` as an extractive answer may use them (outer punctuation stripped)."""
    words = [w.strip(_EDGE_PUNCT) for w in _WORD.findall(text)]
    return [w for w in words if w]


def span_pattern(texts: Sequence[str], extra: Sequence[str] = (), max_words: int = 16) -> str:
    """Anchored regex: one contiguous run (1..max_words words, single spaces) of the words of one
    of `texts`, or exactly one of `extra` (e.g. "not found")."""
    options: list[str] = [escape(e) for e in extra]
    seen: set[tuple[str, ...]] = set()
    for text in texts:
        words = span_words(text)
        for start in range(len(words)):
            run = tuple(words[start : start + max_words])
            if run in seen:
                continue
            seen.add(run)
            options.append(_nested(run))
    if not options:
        options = ["[^\\s].*"]
    return "^(" + "|".join(options) + ")$"


def _nested(words: Sequence[str]) -> str:
    """w1( w2( w3)?)? ...: any prefix of the run, at least its first word."""
    out = ""
    for word in reversed(words[1:]):
        out = f"( {escape(word)}{out})?"
    return escape(words[0]) + out


_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.]*\d)")
MAX_NUMBERS = 64


def context_numbers(text: str) -> list[int | float]:
    """The distinct numbers written in `text`, in order of appearance (at most MAX_NUMBERS, latest kept)."""
    seen: dict[int | float, None] = {}
    for match in _NUMBER.finditer(text):
        value = float(match.group())
        number: int | float = int(value) if value.is_integer() and abs(value) < 2**53 else value
        seen.pop(number, None)
        seen[number] = None
    return list(seen)[-MAX_NUMBERS:]


def _free_number(schema: dict[str, object]) -> bool:
    keys = {"enum", "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
    return schema.get("type") in ("number", "integer") and not (keys & schema.keys())


def ground_numbers(parameters: dict[str, object], numbers: Sequence[int | float]) -> dict[str, object]:
    """A copy of a tool's arguments schema whose free numeric arguments take one of `numbers`.

    A small model otherwise invents values, or spins digits forever ("2.5000000..."). Integer
    arguments take the integral ones. No numbers (or none that fit): the argument stays free.
    """
    properties = parameters.get("properties")
    if not isinstance(properties, dict) or not numbers:
        return parameters
    grounded = {}
    for name, schema in properties.items():
        if isinstance(schema, dict) and _free_number(schema):
            choices = [n for n in numbers if schema["type"] == "number" or isinstance(n, int)]
            if choices:
                schema = {**schema, "enum": choices}
        grounded[name] = schema
    return {**parameters, "properties": grounded}
