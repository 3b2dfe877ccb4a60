"""The agent behaviour suite on the real model: in-process, and over HTTP through `radixagent serve`.

Same checks as against the scripted fake (test_behaviour.py); here the cached tokens in the
trace come from the real radix cache.
"""

from __future__ import annotations

import pytest

from runtime.backends import connect
from runtime.server import ServerArgs, create_app
from tests.support.behaviour import ALL_CHECKS
from tests.support.server_util import LiveServer


@pytest.fixture(scope="module", params=["embedded", "http"])
def real_backend(request, engine):
    if request.param == "embedded":
        backend = connect(engine)
        yield backend
        backend.close()
        return
    with LiveServer(create_app(engine, ServerArgs(max_threads=8))) as live:
        backend = connect(live.url)
        yield backend
        backend.close()


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__)
def test_behaviour_real_model(check, real_backend, engine):
    check(real_backend)
    engine.check_integrity()
