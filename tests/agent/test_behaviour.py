"""The behaviour suite against the scripted fake backend, in token-id and text prompt modes.

The real-engine runs (embedded, `radixagent serve`, SGLang) parametrize the same checks.
"""

from __future__ import annotations

import pytest

from tests.support.behaviour import ALL_CHECKS
from tests.support.fake_backend import FakeBackend, arithmetic_model


@pytest.fixture(params=["token_ids", "text"])
def backend(request):
    return FakeBackend(arithmetic_model, supports_input_ids=request.param == "token_ids")


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__)
def test_behaviour(check, backend):
    check(backend)
