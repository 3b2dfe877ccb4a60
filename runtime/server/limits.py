"""Request-level bounds the HTTP layer enforces before anything recurses into a body.

A message field or `tool_calls` nested ~900 levels deep parsed fine and then overflowed the chat
template's recursion (a 500 that closed the connection); Python's own JSON parser stops near
1,000 levels. Bodies are bounded at MAX_JSON_DEPTH, far above any real request (an OpenAI tool
schema is rarely 10 deep) and far below what templates and validators can recurse through.
"""

from __future__ import annotations

from collections.abc import Iterable

#: nesting of objects and arrays in a request body
MAX_JSON_DEPTH = 64
#: characters of `cache_salt` / `extra_key` (the tree keys a digest; this bounds the request)
MAX_SALT_CHARS = 1024


def check_nesting(value: object, limit: int = MAX_JSON_DEPTH) -> None:
    """ValueError naming the first field nested deeper than `limit`. Iterative: deep input cannot
    overflow this check itself."""
    stack: list[tuple[object, int, tuple[str, ...]]] = [(value, 1, ())]
    while stack:
        item, depth, path = stack.pop()
        if depth > limit:
            where = ".".join(path[:4]) + (". ..." if len(path) > 4 else "")
            raise ValueError(f"{where or 'body'}: nested deeper than {limit} levels of objects/arrays")
        children: Iterable[tuple[object, object]]
        if isinstance(item, dict):
            children = item.items()
        elif isinstance(item, list):
            children = ((str(i), v) for i, v in enumerate(item))
        else:
            continue
        for key, child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1, (*path, str(key)) if len(path) < 5 else path))
