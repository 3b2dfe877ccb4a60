"""Bounds on user-supplied grammars, checked before llguidance sees them, and a big-stack thread
for the compilation itself.

llguidance compiles a schema recursively in native code, one level per `$ref` hop and per nesting
level inside what a `$ref` reaches (measured ~3.5 KiB of stack per level): a ~2,500-hop chain
overflowed the default 8 MiB thread stack and killed the process. A regex's repetition counts
multiply (`a{1000}{1000}` is a million states); llguidance accepts it and fails on the first token
with "too many expressions constructed", after the prompt was prefilled. So: size, nesting depth,
distinct `$ref` targets and regex expansion are bounded here (a 400 naming the limit), and the
compilation runs in a thread with a COMPILE_STACK_BYTES stack. The worst schema the bounds let
through (~6,000 levels in 64 KB, tests/hardening/test_grammar_guard.py) crashes a 24 MiB stack and
compiles in 32 MiB: 256 MiB leaves 8x (address space only; pages are touched as needed).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from runtime.errors import GrammarError

T = TypeVar("T")

#: characters of one json_schema or regex
MAX_GRAMMAR_CHARS = 65_536
#: JSON nesting depth of a schema (objects and arrays)
MAX_SCHEMA_DEPTH = 64
#: distinct `$ref` targets in one schema (each is one native recursion level when chained)
MAX_SCHEMA_REFS = 256
#: a regex's worst-case expanded size: repetition counts multiplied through nesting
MAX_REGEX_EXPANSION = 10_000
#: tools in one request (OpenAI's own limit is 128 functions)
MAX_TOOLS = 256
#: characters of all of one request's tool schemas together (each is also held to MAX_GRAMMAR_CHARS)
MAX_TOOLS_CHARS = 262_144
#: stack of the compile thread (address space only: pages are touched as the recursion needs them)
COMPILE_STACK_BYTES = 256 * 2**20


def check_json_schema(text: str, field: str = "json_schema") -> Any:
    """The parsed schema, or GrammarError naming `field` and the limit it breaks."""
    if len(text) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"{field}: {len(text)} characters; the limit is {MAX_GRAMMAR_CHARS}")
    try:
        schema = json.loads(text)
    except RecursionError:
        raise GrammarError(f"{field}: nested deeper than {MAX_SCHEMA_DEPTH} levels") from None
    except ValueError as exc:
        raise GrammarError(f"{field}: not valid JSON ({exc})") from None
    check_schema_value(schema, field)
    return schema


def check_schema_value(schema: object, field: str) -> None:
    """Shape and bounds of an already parsed schema (response_format's schema arrives parsed)."""
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"{field}: a JSON schema must be an object or a boolean, got {_kind(schema)}")
    refs: set[str] = set()
    stack: list[tuple[object, int]] = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise GrammarError(f"{field}: nested deeper than {MAX_SCHEMA_DEPTH} levels")
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                refs.add(ref)
                if len(refs) > MAX_SCHEMA_REFS:
                    raise GrammarError(f"{field}: more than {MAX_SCHEMA_REFS} distinct $ref targets")
            pattern = node.get("pattern")
            if isinstance(pattern, str):
                check_regex(pattern, f"{field} (pattern)")
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node if isinstance(v, (dict, list)))


def check_tool_schemas(
    schemas: Sequence[object], field: str = "tools", item: str = "tools.{}.function.parameters"
) -> list[str]:
    """Every tool schema of one request, bounded alone and together (count, characters, depth,
    `$ref` targets, patterns), before anything compiles them: the texts as they will be compiled,
    or GrammarError naming the tool and the limit. Whatever door the tools came through (chat,
    Responses, Messages) calls this; `field` and `item` name the door's own fields."""
    if len(schemas) > MAX_TOOLS:
        raise GrammarError(f"{field}: {len(schemas):,} tools; the limit is {MAX_TOOLS}")
    texts: list[str] = []
    total = 0
    for i, schema in enumerate(schemas):
        where = item.format(i)
        check_schema_value(schema, where)  # depth first: serializing an unbounded nesting recurses
        text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
        if len(text) > MAX_GRAMMAR_CHARS:
            raise GrammarError(f"{where}: {len(text)} characters; the limit is {MAX_GRAMMAR_CHARS}")
        total += len(text)
        if total > MAX_TOOLS_CHARS:
            raise GrammarError(
                f"{field}: the tool schemas add up to more than {MAX_TOOLS_CHARS:,} characters (the limit)"
            )
        texts.append(text)
    return texts


def schema_error(text: str) -> str | None:
    """llguidance's complaint about a bounded JSON schema (None when it compiles), compiled on the
    big stack: the caller runs this off the event loop (`asyncio.to_thread`)."""
    import llguidance

    def compile_one() -> str | None:
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(text)
            return llguidance.LLMatcher.validate_grammar(grammar) or None
        except (ValueError, TypeError, RecursionError) as exc:
            return str(exc) or type(exc).__name__

    return run_with_big_stack(compile_one)


def check_regex(regex: str, field: str = "regex") -> None:
    if len(regex) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"{field}: {len(regex)} characters; the limit is {MAX_GRAMMAR_CHARS}")
    size = regex_expansion(regex)
    if size > MAX_REGEX_EXPANSION:
        raise GrammarError(
            f"{field}: too large (repetitions expand to about {size:,} items; the limit is "
            f"{MAX_REGEX_EXPANSION:,}): use smaller repetition counts"
        )


def check_ebnf(grammar: str, field: str = "ebnf") -> None:
    """A grammar's size, bracket nesting and repetition expansion (its terminals are regexes)."""
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"{field}: {len(grammar)} characters; the limit is {MAX_GRAMMAR_CHARS}")
    depth = deepest = 0
    for ch in grammar:
        depth += (ch in "([{") - (ch in ")]}")
        deepest = max(deepest, depth)
    if deepest > MAX_SCHEMA_DEPTH:
        raise GrammarError(f"{field}: brackets nested deeper than {MAX_SCHEMA_DEPTH} levels")
    size = regex_expansion(
        grammar
    )  # atoms count 1 each: only repetition counts can push it past the size bound
    if size > MAX_GRAMMAR_CHARS:
        raise GrammarError(
            f"{field}: too large (repetitions expand to about {size:,} items; the limit is {MAX_GRAMMAR_CHARS:,})"
        )


def regex_expansion(regex: str) -> int:
    """Upper estimate of a regex's expanded size: atoms count 1, a group the sum of its contents
    (all alternatives), `{m,n}` multiplies the preceding item by max(m, n). Malformed syntax is
    left to llguidance (it reports it as a 400)."""
    groups: list[int] = [0]  # running size per open group
    last = 0  # size of the item a quantifier would apply to
    i, n = 0, len(regex)
    while i < n:
        c = regex[i]
        if c == "\\":
            i, last = i + 2, 1
            groups[-1] += 1
            continue
        if c == "[":
            i, last = _class_end(regex, i), 1
            groups[-1] += 1
            continue
        if c == "(":
            groups.append(0)
        elif c == ")" and len(groups) > 1:
            last = max(groups.pop(), 1)
            groups[-1] += last
        elif c == "{":
            end = regex.find("}", i)
            count = _repeat_count(regex[i + 1 : end]) if end > 0 else None
            if count is not None:
                groups[-1] += last * (count - 1)
                last *= count
                i = end + 1
                continue
            last = 1
            groups[-1] += 1
        elif c not in "|*+?":
            last = 1
            groups[-1] += 1
        i += 1
    return sum(groups)


def _class_end(regex: str, start: int) -> int:
    """Index after the `]` closing the character class opened at `start`."""
    i = start + 1
    if i < len(regex) and regex[i] == "^":
        i += 1
    if i < len(regex) and regex[i] == "]":
        i += 1
    while i < len(regex) and regex[i] != "]":
        i += 2 if regex[i] == "\\" else 1
    return i + 1


def _repeat_count(body: str) -> int | None:
    """max(m, n) of a `{m}`, `{m,}` or `{m,n}` quantifier body; None when it is not one."""
    lo, sep, hi = body.partition(",")
    lo, hi = lo.strip(), hi.strip()
    if not lo.isdigit() or (hi and not hi.isdigit()):
        return None
    high = int(hi) if sep and hi else int(lo) + (1 if sep else 0)
    return max(int(lo), high, 1)


def _kind(value: object) -> str:
    return {str: "a string", int: "a number", float: "a number", list: "an array"}.get(type(value), "null")


def run_with_big_stack(fn: Callable[[], T]) -> T:
    """fn() in a fresh thread with a COMPILE_STACK_BYTES stack; its result or exception returned
    here. `threading.stack_size` is process-wide, so it is set and restored under a lock."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    with _STACK_LOCK:
        previous = threading.stack_size(COMPILE_STACK_BYTES)
        try:
            thread = threading.Thread(target=target, name="radixagent-grammar", daemon=True)
            thread.start()
        finally:
            threading.stack_size(previous)
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


# Guards a process-wide setting (the next thread's stack size), so it is process-wide itself.
_STACK_LOCK = threading.Lock()
