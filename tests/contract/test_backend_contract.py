"""One backend contract, run against every backend: the same prompts and the same assertions.

Backends: the scripted fake (tests/agent/fake_backend.py, no model), the embedded engine, our
server over SGLang's native /generate (`SGLangBackend`), our server through the OpenAI-compatible
client (`OpenAIBackend`), and a real SGLang server when `make test-sglang` sets
RADIXAGENT_SGLANG_URL (tests/sglang/run.sh runs this file then; elsewhere that case skips).

Behaviours: cached tokens reported on a repeated prompt (exact: all but the last prompt token),
salt isolation, greedy output identical cached vs uncached, max_new_tokens -> finish_reason
"length", stop strings and stop_token_ids (the output as the unconstrained run, cut where the
stop falls), and typed errors (BackendError, status 400, message naming the field) for bad
values. Every call goes through `call` below: adapting the suite to a new request type is a
change there only.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from runtime.backends import Backend, Completion, connect
from runtime.errors import BackendError
from tests.support.fake_backend import FakeBackend

SGLANG_URL = os.environ.get("RADIXAGENT_SGLANG_URL")
PROMPT = "Here is a short list of colours: red, green, blue, yellow. Please repeat the list back:"
FAKE_OUTPUT = " red, green, blue, yellow, purple, orange and white are the colours of the list."


def call(backend: Backend, prompt: str, salt: str, **sampling: Any) -> Completion:
    """The suite's one way to send a request (greedy unless `sampling` says otherwise)."""
    return backend.generate(prompt, sampling_params={"temperature": 0, **sampling}, cache_salt=salt)


@dataclass
class Subject:
    """A backend under test, and one that returns output token ids for the same model (itself,
    except for the OpenAI client, which sees no ids: then the native client of the same server)."""

    backend: Backend
    with_ids: Backend


def _fresh_salt() -> str:  # every test starts from an empty namespace of the shared cache
    return f"contract-{uuid.uuid4().hex[:12]}"


@pytest.fixture(
    scope="module",
    params=[
        "fake",
        pytest.param("embedded", marks=pytest.mark.slow),
        pytest.param("native", marks=pytest.mark.slow),
        pytest.param("openai", marks=pytest.mark.slow),
        pytest.param(
            "sglang",
            marks=pytest.mark.skipif(
                not SGLANG_URL, reason="RADIXAGENT_SGLANG_URL not set (make test-sglang)"
            ),
        ),
    ],
)
def subject(request: pytest.FixtureRequest) -> Iterator[Subject]:
    kind = request.param
    if kind == "fake":
        fake = FakeBackend(lambda _call: FAKE_OUTPUT, eos_in_output=True)
        yield Subject(fake, fake)
        return
    if kind == "sglang":
        assert SGLANG_URL is not None
        real = connect(SGLANG_URL)
        yield Subject(real, real)
        real.close()
        return
    engine = request.getfixturevalue("engine")
    if kind == "embedded":
        embedded = connect(engine)
        yield Subject(embedded, embedded)
        return
    from runtime.server import ServerArgs, create_app
    from tests.support.server_util import LiveServer

    with LiveServer(create_app(engine, ServerArgs(max_threads=8))) as live:
        native = connect(live.url)
        client = native if kind == "native" else connect(f"openai:{live.url}/v1")
        yield Subject(client, native)
        if client is not native:
            client.close()
        native.close()


def test_repeated_prompt_reports_all_but_the_last_token_cached(subject: Subject) -> None:
    salt = _fresh_salt()
    first = call(subject.backend, PROMPT, salt, max_new_tokens=4)
    again = call(subject.backend, PROMPT, salt, max_new_tokens=4)
    assert first.prompt_tokens > 8 and first.cached_tokens == 0
    assert again.prompt_tokens == first.prompt_tokens
    assert again.cached_tokens == again.prompt_tokens - 1  # one token is always computed
    longer = call(subject.backend, PROMPT + " red, green", salt, max_new_tokens=4)
    assert first.prompt_tokens - 1 <= longer.cached_tokens < longer.prompt_tokens


def test_salts_do_not_share_cached_tokens(subject: Subject) -> None:
    warm = call(subject.backend, PROMPT, _fresh_salt(), max_new_tokens=2)
    other = call(subject.backend, PROMPT, _fresh_salt(), max_new_tokens=2)
    assert warm.prompt_tokens == other.prompt_tokens and other.cached_tokens == 0


def test_greedy_output_is_the_same_cached_and_uncached(subject: Subject) -> None:
    salt = _fresh_salt()
    cold = call(subject.backend, PROMPT, salt, max_new_tokens=12)
    warm = call(subject.backend, PROMPT, salt, max_new_tokens=12)
    assert warm.cached_tokens > 0 and warm.text == cold.text


def test_max_new_tokens_ends_with_finish_reason_length(subject: Subject) -> None:
    out = call(subject.backend, PROMPT, _fresh_salt(), max_new_tokens=3, ignore_eos=True)
    assert out.completion_tokens == 3 and out.finish_reason == "length"


def test_stop_string_cuts_the_output_before_it(subject: Subject) -> None:
    salt = _fresh_salt()
    free = call(subject.backend, PROMPT, salt, max_new_tokens=16, ignore_eos=True)
    words = re.findall(r"\w{3,}", free.text)
    assert len(words) >= 2, free.text
    stop = words[1]  # a word after the first: the cut output is not empty
    out = call(subject.backend, PROMPT, salt, max_new_tokens=16, ignore_eos=True, stop=[stop])
    assert out.finish_reason == "stop"
    assert out.text == free.text[: free.text.index(stop)]


def test_stop_token_id_ends_the_output_at_that_token(subject: Subject) -> None:
    salt = _fresh_salt()
    free = call(subject.with_ids, PROMPT, salt, max_new_tokens=16, ignore_eos=True)
    ids = free.output_ids
    k = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])  # first occurrence, not at once
    out = call(subject.backend, PROMPT, salt, max_new_tokens=16, ignore_eos=True, stop_token_ids=[ids[k]])
    assert out.finish_reason == "stop"
    assert out.completion_tokens == k + 1  # the stop token is generated and counted ...
    assert free.text.startswith(out.text) and len(out.text) < len(free.text)  # ... not shown


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_new_tokens", -1), ("temperature", -0.5)],
)
def test_bad_sampling_value_is_a_typed_400_naming_the_field(subject: Subject, field: str, value: Any) -> None:
    with pytest.raises(BackendError) as err:
        call(subject.backend, PROMPT, _fresh_salt(), **{field: value})
    assert err.value.status == 400
    # the OpenAI client sends max_new_tokens as max_tokens: either name is the field
    names = {"max_new_tokens": r"max_(new_)?tokens", "temperature": "temperature"}
    assert re.search(names[field], str(err.value)), str(err.value)
