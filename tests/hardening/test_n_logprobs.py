"""Issue 39, class 9: n / best_of choices with logprobs on a long prompt. Each choice computed the
prompt itself (logprob requests read nothing from the cache) while the tree locks the copy another
choice published, so the admission check over-committed the pool and a choice failed with a 503
PoolExhausted that no retry could avoid. Such a choice now waits for the running ones (and the
choices of one prompt now share its prefill: tests/hardening/test_logprob_twins.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from runtime.server import ServerArgs, create_app
from tests.support.server_util import LiveServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def small_pool(engine: Any) -> Iterator[tuple[LiveServer, Any]]:
    sibling = engine.sibling(max_total_tokens=1024)
    with LiveServer(create_app(sibling, ServerArgs())) as live:
        yield live, sibling
    sibling.shutdown()


@pytest.mark.parametrize(("n", "best_of"), [(4, 4), (2, 5)])
def test_choices_with_logprobs_all_complete_on_a_small_pool(small_pool: Any, n: int, best_of: int) -> None:
    live, sibling = small_pool
    body = {"prompt": "word " * 300, "n": n, "best_of": best_of, "logprobs": 1, "max_tokens": 4, "seed": 1}
    r = httpx.post(f"{live.url}/v1/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == n and all(len(c["logprobs"]["tokens"]) == 4 for c in choices)
    sibling.check_integrity()
