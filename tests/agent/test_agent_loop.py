"""The agent loop against the scripted fake backend."""

from __future__ import annotations

import asyncio
import json

import pytest

from agent import Agent
from agent.layout import normalize_document, render_head_text
from runtime.errors import BackendError
from tests.support.behaviour import SYSTEM, add, multiply
from tests.support.fake_backend import FakeBackend, arithmetic_model


def _extends(calls) -> None:
    """Each prompt is the previous prompt + its output (+ new pieces), token for token."""
    for prev, cur in zip(calls, calls[1:], strict=False):
        full = prev.input_ids + cur.input_ids[len(prev.input_ids) : len(prev.input_ids)]
        assert cur.input_ids[: len(prev.input_ids)] == prev.input_ids == full


def test_tool_call_then_answer_with_cache_hits():
    backend = FakeBackend(arithmetic_model)
    result = Agent(backend, system=SYSTEM, tools=[add, multiply]).run("What is 17 + 25?")
    assert result.status == "answered" and result.answer == "42"
    assert [r.kind for r in result.trace] == ["act", "answer"]
    assert result.trace[0].tool == {
        "name": "add",
        "arguments": {"a": 17, "b": 25},
        "result": "42",
        "error": None,
    }
    assert (
        result.trace[1].cached_tokens == result.trace[1].ideal_cached_tokens > result.trace[0].prompt_tokens
    )
    assert result.cache_fidelity == 1.0 and not result.prefix_breaks
    _extends(backend.calls)
    schema = json.loads(backend.calls[0].sampling_params["json_schema"])
    assert [b["properties"].get("tool", {}).get("const") for b in schema["anyOf"]][:2] == ["add", "multiply"]
    assert backend.calls[0].sampling_params["temperature"] == 0.0


def test_session_events_open_tool_wait_resume_close():
    backend = FakeBackend(arithmetic_model)
    result = Agent(backend, system=SYSTEM, tools=[add], session_id="sess-1").run("What is 1 + 2?")
    kinds = [(sid, ev) for sid, ev, _ in backend.events]
    assert kinds == [("sess-1", "open"), ("sess-1", "tool_wait"), ("sess-1", "resume"), ("sess-1", "close")]
    assert backend.events[1][2]["expected_s"] == 0.01
    assert all(c.session_id == "sess-1" for c in backend.calls) and result.session_id == "sess-1"


def test_validation_error_is_observation_and_reflection_is_appended():
    outputs = [
        '{"tool":"add","arguments":{"a":"x","b":2}}',
        '{"thought":"a must be an integer"}',
        '{"answer":"3"}',
    ]
    backend = FakeBackend(outputs)
    result = Agent(backend, system=SYSTEM, tools=[add]).run("What is 1 + 2?")
    assert result.status == "answered"
    assert [r.kind for r in result.trace] == ["act", "reflect", "answer"]
    assert result.trace[0].tool["error"].startswith("a:")
    assert "Error [call_0] (validation)" in backend.calls[1].prompt
    assert backend.calls[1].prompt.rstrip().endswith("<|im_start|>assistant")
    assert "Reflect:" in backend.calls[1].prompt
    _extends(backend.calls)  # reflection only appends
    assert not result.prefix_breaks


def test_unknown_tool_and_parse_error_are_observations():
    outputs = ['{"tool":"nope","arguments":{}}', "not json", '{"answer":"ok"}']
    backend = FakeBackend(outputs)
    result = Agent(backend, system=SYSTEM, tools=[add], reflect=False).run("task")
    assert result.status == "answered"
    assert "unknown_tool" in backend.calls[1].prompt and "not a valid action" in backend.calls[2].prompt


def test_step_budget_ends_runaway_loop():
    backend = FakeBackend(['{"tool":"add","arguments":{"a":1,"b":1}}'])
    result = Agent(backend, system=SYSTEM, tools=[add], max_steps=4).run("loop forever")
    assert result.status == "max_steps" and result.answer is None
    assert len(result.trace) == 4 == len(backend.calls)


def test_reflect_every_k_steps():
    backend = FakeBackend(['{"tool":"add","arguments":{"a":1,"b":1}}'])
    result = Agent(backend, system=SYSTEM, tools=[add], max_steps=6, reflect=2).run("loop")
    assert [r.kind for r in result.trace] == ["act", "act", "reflect", "act", "reflect", "act"]
    _extends(backend.calls)


def test_verify_rejection_rolls_back_to_checkpoint():
    backend = FakeBackend(['{"answer":"41"}', '{"answer":"42"}'])
    agent = Agent(backend, system=SYSTEM, tools=[add], verify=lambda a: (a == "42", "wrong sum"))
    result = agent.run("What is 17 + 25?")
    assert result.status == "answered" and result.answer == "42" and result.verified is True
    assert [r.kind for r in result.trace] == ["answer", "backtrack"]
    first, retry = backend.calls
    # The retry extends the checkpoint (head + task), not the abandoned answer.
    assert retry.input_ids[: len(first.input_ids) - 3] == first.input_ids[:-3]
    assert "41" not in retry.prompt.split("rejected")[0].replace("answered '41'", "")
    assert result.trace[1].cached_tokens >= len(first.input_ids) - 3 and not result.prefix_breaks
    assert result.steps[0].abandoned and not result.steps[1].abandoned
    abandon = [info for _, ev, info in backend.events if ev == "abandon"]
    assert len(abandon) == 1 and abandon[0]["input_ids"][: len(first.input_ids)] == first.input_ids
    assert (
        abandon[0]["keep"] == len(first.input_ids) - 3
    )  # the checkpoint: prompt minus "<|im_start|>assistant\n"


def test_dead_end_backtracks_then_gives_up():
    backend = FakeBackend(['{"dead_end":"no tool fits"}'])
    result = Agent(backend, system=SYSTEM, tools=[add], max_backtracks=1).run("impossible")
    assert result.status == "dead_end"
    assert [r.kind for r in result.trace] == ["act", "backtrack"]


def test_repeated_errors_abandon_the_branch():
    backend = FakeBackend(['{"tool":"add","arguments":{}}'])
    result = Agent(backend, system=SYSTEM, tools=[add], max_errors=2, reflect=False, max_steps=5).run("t")
    kinds = [r.kind for r in result.trace]
    assert kinds[:3] == ["act", "act", "backtrack"] and not result.prefix_breaks


def test_custom_policy_with_checkpoint_and_rollback():
    backend = FakeBackend(arithmetic_model)
    run = Agent(backend, system=SYSTEM, tools=[add]).start("What is 2 + 3?")
    cp = run.checkpoint()
    step = run.step()
    assert step.tool["result"] == "5"
    run.rollback(cp, note="Try again, add 2 and 4.")
    retry = run.step()
    assert retry.kind == "backtrack" and retry.tool["arguments"] == {"a": 2, "b": 4}
    assert retry.record.prefix_break is None and retry.record.cached_tokens >= len(cp.units) - 1
    run.run_to_end()
    assert run.result().answer == "6"


def test_model_error_stored_as_data():
    def broken(call):
        raise BackendError("server exploded", status=500)

    result = Agent(FakeBackend(broken), system=SYSTEM, tools=[add]).run("t")
    assert result.status == "error" and "server exploded" in result.steps[0].error
    assert result.trace[0].finish_reason == "error"


def test_fork_prefills_once_and_branches_share_it():
    backend = FakeBackend(arithmetic_model)
    results = Agent(backend, system=SYSTEM, tools=[add]).fork(4, "What is 17 + 25?")
    assert [r.answer for r in results] == ["42"] * 4 and results.best is results[0]
    prefill_calls = [c for c in backend.calls if c.sampling_params["max_new_tokens"] == 0]
    assert len(prefill_calls) == 1 and backend.calls[0] is prefill_calls[0]
    firsts = [r.trace[0] for r in results]
    assert all(f.cached_tokens == results.prefill.prompt_tokens - 1 for f in firsts)
    seeds = sorted(c.sampling_params.get("seed") for c in backend.calls[1:] if c.cached_tokens)
    assert set(seeds) == {1, 2, 3, 4}
    assert all(c.sampling_params["temperature"] == 0.7 for c in backend.calls[1:])
    assert len({r.session_id for r in results}) == 1


def test_fork_falls_back_to_one_token_prefill():
    backend = FakeBackend(arithmetic_model, zero_new_tokens_ok=False)
    results = Agent(backend, system=SYSTEM, tools=[add]).fork(2, "What is 1 + 1?")
    assert results.prefill is not None and results.prefill.kind == "fork"
    assert all(not r.prefix_breaks for r in results)


def test_arun():
    result = asyncio.run(
        Agent(FakeBackend(arithmetic_model), system=SYSTEM, tools=[add]).arun("What is 3 + 4?")
    )
    assert result.answer == "7"


def test_text_mode_without_tokenizer_scales_ideal():
    backend = FakeBackend(arithmetic_model, supports_input_ids=False, can_tokenize=False)
    result = Agent(backend, system=SYSTEM, tools=[add]).run("What is 17 + 25?")
    assert result.answer == "42" and not result.prefix_breaks
    second = result.trace[1]
    assert 0 < second.ideal_cached_tokens < second.prompt_tokens
    assert abs(second.ideal_cached_tokens - second.cached_tokens) <= 0.05 * second.prompt_tokens


def test_head_is_canonical_and_documents_normalized():
    a = render_head_text("S", [add, multiply], ["caf\u0065\u0301 \r\nline  \n"], True)
    b = render_head_text("S", [multiply, add], ["caf\u00e9 \nline\n"], True)
    assert a == b
    assert normalize_document("\n\nx  \r\ny\t \n") == "x\ny"


def test_token_prompts_can_be_forced_off():
    backend = FakeBackend(arithmetic_model)
    Agent(backend, system=SYSTEM, tools=[add], token_prompts=False).run("What is 1 + 2?")
    assert len(backend.calls) == 2  # text prompts still work against an ids-capable backend


@pytest.mark.parametrize("bad", [{"max_steps": 0}, {"reflect": 0}, {"sampling": {"json_schema": "{}"}}])
def test_config_validation(bad):
    with pytest.raises(ValueError):
        Agent(FakeBackend(["x"]), **bad)
