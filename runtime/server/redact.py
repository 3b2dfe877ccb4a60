"""Credentials never leave the server: `/get_server_info` (and anything else that echoes
configuration) passes its body through `redact` first.

A URL keeps its scheme, host, port and path; its userinfo (`redis://:password@host`) and the values
of credential-looking query parameters become `***`. A field whose name says it holds a secret
(`*key*`, `*secret*`, `*password*`, `*token*`, `*credential*`, `*auth*`) is replaced whole, whatever
its value; `api_key_set`-style booleans stay, as they say only whether one is configured.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
_SECRET_NAME = re.compile(r"key(?!s?_set)|secret|passw|token(?!izer|s)|credential|auth(?!or)", re.IGNORECASE)
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
#: names about secrets that carry no secret themselves (a count, a flag, a token budget)
_SAFE_SUFFIXES = ("_set", "_tokens", "_count", "_len")


def redact(value: Any) -> Any:
    """A copy of `value` with every credential masked (dicts, lists, strings; others as they are)."""
    if isinstance(value, dict):
        return {k: _field(str(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return redact_url(value) if _URL.match(value) else value
    return value


def _field(name: str, value: Any) -> Any:
    # a credential is text: numbers under such names are figures (kv_bytes_per_token, key counts)
    if _secret_name(name) and isinstance(value, (str, bytes)):
        return MASK
    return redact(value)


def _secret_name(name: str) -> bool:
    lowered = name.lower()
    if lowered.endswith(_SAFE_SUFFIXES) or "max_" in lowered or "num_" in lowered:
        return False
    return bool(_SECRET_NAME.search(lowered))


def redact_url(url: str) -> str:
    """The URL without its userinfo's secret, and with credential-looking query values masked."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return MASK
    netloc = host if port is None else f"{host}:{port}"
    if parts.username is not None or parts.password is not None:
        netloc = f"{MASK}@{netloc}"
    query = urlencode(
        [
            (k, MASK if _SECRET_NAME.search(k) else v)
            for k, v in parse_qsl(parts.query, keep_blank_values=True)
        ]
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
