"""SGLang's own frontend (`sgl.function` + `sgl.RuntimeEndpoint`) against `radixagent serve`.

Needs the test-only client: `bash tests/sglang/install_client.sh` (sglang==0.5.23 --no-deps).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# `make test` installs the client into .sgl-client (tests/sglang/install_client.sh), outside the
# product venv; appended, so the venv's own packages keep precedence.
CLIENT_DIR = Path(__file__).resolve().parents[2] / ".sgl-client"
if CLIENT_DIR.is_dir() and str(CLIENT_DIR) not in sys.path:
    sys.path.append(str(CLIENT_DIR))

# Import a submodule: tests/sglang/ on sys.path would otherwise pass for an empty `sglang`
# namespace package when the real client is not installed.
pytest.importorskip(
    "sglang.lang", reason="SGLang's frontend client is not installed (bash tests/sglang/install_client.sh)"
)
import sglang as sgl  # noqa: E402


def test_sgl_function_through_runtime_endpoint(server, engine) -> None:
    backend = sgl.RuntimeEndpoint(server.url)
    assert backend.get_model_name() == engine.model_info["model_path"]

    @sgl.function
    def qa(s, question):
        s += "Question: " + question + "\nAnswer:"
        s += sgl.gen("answer", max_tokens=4, temperature=0, stop="\n")

    state = qa.run(question="What is the capital of France?", backend=backend)
    answer = state["answer"]
    assert isinstance(answer, str)
    meta = state.get_meta_info("answer")
    assert "cached_tokens" in meta and meta["prompt_tokens"] > 0
    expected = engine.generate(
        prompt="Question: What is the capital of France?\nAnswer:",
        sampling_params={"max_new_tokens": 4, "temperature": 0, "stop": "\n"},
    )
    assert answer == expected["text"]


def test_sgl_stream_and_cache_prefix(server) -> None:
    backend = sgl.RuntimeEndpoint(server.url)
    backend.cache_prefix("A shared preamble for the sgl client test. ")
    backend.flush_cache()

    @sgl.function
    def count(s):
        s += "1, 2, 3,"
        s += sgl.gen("more", max_tokens=3, temperature=0)

    state = count.run(stream=True, backend=backend)
    pieces = list(state.text_iter("more"))
    assert "".join(pieces) == state["more"]


def test_sgl_select_scores_choices_by_logprob(server, engine) -> None:
    """`sgl.select` scores every choice with prompt logprobs (return_logprob + logprob_start_len)."""
    backend = sgl.RuntimeEndpoint(server.url)
    choices = [" blue", " green", " purple"]

    @sgl.function
    def pick(s):
        s += "Q: What color is the sky on a clear day?\nA: The sky is"
        s += sgl.select("color", choices=choices)

    state = pick.run(backend=backend)
    meta = state.get_meta_info("color")
    scores = meta["normalized_prompt_logprobs"]
    assert state["color"] == choices[scores.index(max(scores))]
    # SGLang's client scores from prompt_len - 2 (token healing) and averages the logprobs it got
    prefix = "Q: What color is the sky on a clear day?\nA: The sky is"
    start = len(engine.tokenize(prefix)) - 2
    for choice, score in zip(choices, scores, strict=True):
        out = engine.generate(
            prompt=prefix + choice,
            sampling_params={"max_new_tokens": 0},
            return_logprob=True,
            logprob_start_len=start,
        )
        values = [lp for lp, _, _ in out["meta_info"]["input_token_logprobs"][1:]]
        assert score == pytest.approx(sum(values) / len(values), abs=1e-4) and score < 0


def test_sgl_gen_returns_logprobs(server) -> None:
    backend = sgl.RuntimeEndpoint(server.url)

    @sgl.function
    def continue_(s):
        s += "Once upon a time"
        s += sgl.gen(
            "rest",
            max_tokens=4,
            temperature=0,
            return_logprob=True,
            top_logprobs_num=2,
            return_text_in_logprobs=True,
        )

    state = continue_.run(backend=backend)
    meta = state.get_meta_info("rest")
    outputs = meta["output_token_logprobs"]
    assert len(outputs) == meta["completion_tokens"] == 4
    assert all(lp <= 0 and isinstance(text, str) for lp, _, text in outputs)
    assert [top[0][1] for top in meta["output_top_logprobs"]] == [tid for _, tid, _ in outputs]  # greedy
