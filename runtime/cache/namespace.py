"""Cache namespaces and session scopes from `cache_salt` (and SGLang's `extra_key`).

The key is a digest of a length-prefixed encoding of (salt, extra_key): `extra_key: X` and
`cache_salt: X` differ, `cache_salt: "a|b"` differs from salt `a` + extra_key `b`, and a 1 MiB salt
costs the tree a 32-character root key. No salt and no extra_key is the default namespace "".
"""

from __future__ import annotations

import hashlib
from typing import overload

#: what `Engine.generate(cache_salt=...)` takes per prompt: a salt, or (salt, extra_key)
Salt = str | tuple[str | None, str | None] | None


def split_salt(cache_salt: Salt) -> tuple[str, str]:
    if isinstance(cache_salt, tuple):
        salt, extra = cache_salt
        return salt or "", extra or ""
    return cache_salt or "", ""


def namespace_key(cache_salt: Salt) -> str:
    """The radix tree's namespace for this salt: "" without one, else a 32-hex-digit digest."""
    salt, extra = split_salt(cache_salt)
    if not salt and not extra:
        return ""
    digest = hashlib.blake2b(digest_size=16)
    for part in (salt, extra):
        data = part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


@overload
def session_key(cache_salt: Salt, session_id: str) -> str: ...
@overload
def session_key(cache_salt: Salt, session_id: None) -> None: ...
def session_key(cache_salt: Salt, session_id: str | None) -> str | None:
    """The session registry's key: sessions belong to the salt (the tenant) that used them, so
    another tenant's id is simply not there. Unsalted sessions keep their plain id."""
    if session_id is None:
        return None
    salt, _ = split_salt(cache_salt)
    return session_id if not salt else f"{namespace_key(salt)}/{session_id}"
