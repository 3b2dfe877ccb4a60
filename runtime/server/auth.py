"""The admin role (SGLang's `--admin-api-key`): endpoints that act on every tenant at once (swap the
weights, flush the cache, abort requests) need the admin key.

- `--admin-api-key` set: those paths need `Authorization: Bearer ADMIN_KEY` (403 otherwise; the
  admin key also passes the ordinary `--api-key` check, see ApiKeyMiddleware).
- `--api-key` set and no admin key: those paths are refused (403) for everyone: an ordinary key
  holder is a tenant, never an admin.
- neither set: an open server (a local one); everything is open, as before.

`/abort_request` is also a tenant's: without the admin role it must name a `cache_salt` and
reaches only requests in that salt's namespace (a rid prefix or `abort_all` included).
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.server.errors import error_response

#: endpoints whose effect reaches every tenant
ADMIN_PATHS = frozenset({"/update_weights_from_disk", "/flush_cache", "/abort_request"})
#: admin paths a tenant may call for its own tenant only: the route reads `ADMIN_SCOPE` and
#: narrows the effect to the caller's `cache_salt` (runtime/server/control.py)
TENANT_SCOPED = frozenset({"/abort_request"})
#: scope["state"] key: whether this request holds the admin role (set by AdminGate)
ADMIN_SCOPE = "radixagent_admin"


def bearer(scope: Scope) -> bytes | None:
    """The one Bearer token of the request; None with none or with two Authorization headers."""
    values = [v for name, v in scope.get("headers") or [] if name == b"authorization"]
    if len(values) != 1:
        return None
    scheme, _, token = values[0].decode("latin-1").partition(" ")
    return token.strip().encode() if scheme.lower() == "bearer" else None


def is_admin(scope: Scope, admin_key: bytes | None) -> bool:
    token = bearer(scope)
    return admin_key is not None and token is not None and hmac.compare_digest(token, admin_key)


class AdminGate:
    """Runs outside the API-key check: admin paths are decided here, first."""

    def __init__(self, app: ASGIApp, admin_key: str | None) -> None:
        self.app = app
        self.key = admin_key.encode() if admin_key is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in ADMIN_PATHS:
            await self.app(scope, receive, send)
            return
        admin = is_admin(scope, self.key)
        if admin or scope["path"] in TENANT_SCOPED:
            scope.setdefault("state", {})[ADMIN_SCOPE] = admin
            await self.app(scope, receive, send)
            return
        why = "needs the admin key" if self.key is not None else "is disabled: no --admin-api-key is set"
        response = error_response(403, f"{scope['path']} {why}", "permission_error")
        await response(scope, receive, send)
