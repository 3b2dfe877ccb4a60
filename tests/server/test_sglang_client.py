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
