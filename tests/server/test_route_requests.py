"""The routes hand the engine `GenerationRequest` objects only, built once (issue 18): what each
route builds (prompts, rids of batches and choices, seeds of n > 1, best_of's logprobs, shared
fields), the bridge refusing anything else, and the trace dir reading the requests. A recording
engine stands in for the model, so nothing here loads it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from runtime.engine.generation import GenerationRequest
from runtime.engine.stats import EngineInfo
from runtime.server import ServerArgs, create_app
from runtime.server.bridge import EngineBridge
from tests.support.fake_engine import fake_info


def _out(request: GenerationRequest, logprob: float = -1.0) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": request.rid,
        "prompt_tokens": len(request.input_ids or ()) or 3,
        "completion_tokens": 1,
        "cached_tokens": 0,
        "finish_reason": {"type": "length", "length": 1},
        "e2e_latency": 0.01,
        "ttft": 0.01,
    }
    if request.logprobs.return_logprob:
        meta["output_token_logprobs"] = [(logprob, 5, "x")]
    return {"text": "x", "output_ids": [5], "meta_info": meta}


class RecordingEngine:
    """What the server calls on an engine, recording every request it is handed."""

    tokenizer = None  # no chat template of its own: apply_chat_template below renders

    def info(self) -> EngineInfo:
        return fake_info("fake", context_length=64, vocab_size=100)

    def __init__(self) -> None:
        self.runs: list[list[GenerationRequest]] = []
        self.streams: list[GenerationRequest] = []

    def run(self, requests: Sequence[GenerationRequest]) -> list[dict[str, Any]]:
        self.runs.append(list(requests))
        # later candidates rank higher, so best_of's pick is visible
        return [_out(r, logprob=-1.0 / (i + 1)) for i, r in enumerate(requests)]

    def stream(self, request: GenerationRequest) -> Iterator[dict[str, Any]]:
        self.streams.append(request)
        return iter([_out(request)])

    def tokenize(self, text: str) -> list[int]:
        return [ord(c) % 100 for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(65 + i % 26) for i in ids)

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        return "".join(m["content"] for m in messages)

    def abort_request(self, rid: str = "", abort_all: bool = False) -> int:
        return 0

    def session_is_open(self, session_id: str, cache_salt: str | None = None) -> bool:
        return True


@pytest.fixture
def fake() -> RecordingEngine:
    return RecordingEngine()


def _client(engine: RecordingEngine, **args: Any) -> TestClient:
    return TestClient(create_app(engine, ServerArgs(**args)))  # type: ignore[arg-type]


def test_generate_hands_one_request_per_prompt(fake: RecordingEngine) -> None:
    with _client(fake) as client:
        one = client.post(
            "/generate",
            json={"text": "hi", "rid": "a", "sampling_params": {"max_new_tokens": 1}, "priority": 3},
        )
        batch = client.post(
            "/generate",
            json={
                "input_ids": [[1, 2], [3]],
                "rid": "job",
                "sampling_params": [{"max_new_tokens": 1}, {"max_new_tokens": 2}],
                "cache_salt": "t",
                "extra_key": "k",
                "session_id": "s",
                "return_logprob": [True, False],
            },
        )
    assert one.status_code == 200 and isinstance(one.json(), dict)
    assert batch.status_code == 200 and [o["meta_info"]["id"] for o in batch.json()] == ["job_0", "job_1"]
    (single,), (first, second) = fake.runs
    assert single.prompt == "hi" and single.rid == "a" and single.priority == 3
    assert single.sampling_params["max_new_tokens"] == 1
    assert (first.input_ids, second.input_ids) == ((1, 2), (3,))
    assert [first.sampling_params["max_new_tokens"], second.sampling_params["max_new_tokens"]] == [1, 2]
    assert first.cache_salt == second.cache_salt == ("t", "k") and first.session_id == "s"
    assert (first.logprobs.return_logprob, second.logprobs.return_logprob) == (True, False)


def test_bad_fields_are_400s_naming_them(fake: RecordingEngine) -> None:
    with _client(fake, require_cache_salt=True) as client:
        unsalted = client.post("/generate", json={"text": "hi"})
        with_salt = {"cache_salt": "t"}
        uneven = client.post(
            "/generate",
            json={"text": ["a", "b", "c"], "sampling_params": [{}, {}], **with_salt},
        )
        rids = client.post("/generate", json={"text": ["a", "b"], "rid": ["x"], **with_salt})
        streamed = client.post("/generate", json={"text": ["a", "b"], "stream": True, **with_salt})
    for resp, field in [
        (unsalted, "cache_salt"),
        (uneven, "sampling_params"),
        (rids, "rid"),
        (streamed, "stream"),
    ]:
        assert resp.status_code == 400 and field in resp.json()["error"]["message"], resp.json()
    assert fake.runs == [] and fake.streams == []


def test_openai_choices_are_requests_with_their_seed_and_rid(fake: RecordingEngine) -> None:
    with _client(fake) as client:
        resp = client.post(
            "/v1/completions",
            json={"prompt": ["p", "q"], "n": 2, "seed": 5, "rid": "r", "max_tokens": 1, "session_id": "s"},
        )
        streamed = client.post(
            "/v1/completions", json={"prompt": "p", "n": 2, "seed": 9, "rid": "t", "stream": True}
        )
    assert resp.status_code == 200 and len(resp.json()["choices"]) == 4
    (choices,) = fake.runs  # one engine call for every prompt and choice
    assert [c.prompt for c in choices] == ["p", "p", "q", "q"]
    assert [c.sampling_params["seed"] for c in choices] == [5, 6, 5, 6]
    assert [c.rid for c in choices] == ["r_0", "r_1", "r_2", "r_3"]
    assert {c.session_id for c in choices} == {"s"}
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    assert [(s.rid, s.sampling_params["seed"]) for s in fake.streams] == [("t_0", 9), ("t_1", 10)]


def test_best_of_asks_for_logprobs_and_returns_the_best(fake: RecordingEngine) -> None:
    with _client(fake) as client:
        resp = client.post("/v1/completions", json={"prompt": "p", "best_of": 3, "n": 1, "rid": "b"})
        plain = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "m"}]})
    assert resp.status_code == 200 and plain.status_code == 200
    ranked, (chat,) = fake.runs
    assert [c.logprobs.return_logprob for c in ranked] == [True, True, True]
    assert [c.rid for c in ranked] == ["b_0", "b_1", "b_2"]
    (choice,) = resp.json()["choices"]
    assert choice["logprobs"] is None  # asked for by the server to rank, not shown
    assert chat.prompt == "m" and not chat.logprobs.return_logprob and chat.rid is not None


def test_health_generate_probes_with_one_uncached_request(fake: RecordingEngine) -> None:
    with _client(fake) as client:
        assert client.get("/health_generate").status_code == 200
    ((probe,),) = fake.runs
    assert probe.input_ids == (0,) and probe.prefix_cache is False


def test_the_bridge_runs_request_objects_only(fake: RecordingEngine) -> None:
    bridge = EngineBridge(fake, 2)  # type: ignore[arg-type]
    request = GenerationRequest(prompt="hi", rid="a")
    for bad in ({"prompt": "hi"}, "hi", request, [], [{"prompt": "hi"}]):
        with pytest.raises(TypeError):
            asyncio.run(bridge.generate(bad))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        asyncio.run(bridge.generate(prompt="hi"))  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        asyncio.run(bridge.open_stream({"prompt": "hi"}))  # type: ignore[arg-type]
    assert fake.runs == [] and fake.streams == []
    outs = asyncio.run(bridge.generate([request]))
    assert [o["meta_info"]["id"] for o in outs] == ["a"] and fake.runs == [[request]]


def test_trace_dir_reads_the_requests(fake: RecordingEngine, tmp_path: Path) -> None:
    with _client(fake, trace_dir=str(tmp_path)) as client:
        client.post("/generate", json={"input_ids": [1, 2, 3], "session_id": "s"})
        client.post("/v1/completions", json={"prompt": "abc", "prompt_cache_key": "k", "n": 2})
        client.post("/v1/completions", json={"prompt": "abc", "stream": True, "prompt_cache_key": "k"})
        client.post("/generate", json={"input_ids": [1, 2, 3]})  # unnamed: not traced
    rows = [json.loads(line) for line in (tmp_path / "default.jsonl").read_text().splitlines()]
    assert [(r["session_id"], r["step"]) for r in rows] == [("s", 0), ("k", 0), ("k", 1), ("k", 2)]
