"""The Responses event sequence: order, numbering, and a cut-off call still closed."""

from __future__ import annotations

from runtime.server.responses.stream import EventSequence


def _kinds(events: list[dict]) -> list[str]:
    return [e["type"] for e in events]


def test_text_then_call_full_sequence() -> None:
    seq = EventSequence(response={"id": "resp_1", "object": "response"})
    events = seq.start() + seq.text_delta("Hi", "msg_1") + seq.text_delta("!", "msg_1")
    events += seq.call_delta('{"a":', "fc_1", "call_1", "add") + seq.call_delta("1}", "fc_1", "call_1", "add")
    events += seq.finish("completed", {"input_tokens": 3, "output_tokens": 4})
    assert _kinds(events) == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]["output"]
    assert final[0]["content"][0]["text"] == "Hi!" and final[1]["arguments"] == '{"a":1}'


def test_cut_off_call_is_closed_incomplete() -> None:
    seq = EventSequence(response={"id": "resp_2"})
    events = seq.start() + seq.call_delta('{"a":', "fc_1", "call_1", "add")
    events += seq.finish("incomplete", {}, {"reason": "max_output_tokens"})
    assert _kinds(events)[-3:] == [
        "response.function_call_arguments.done", "response.output_item.done", "response.incomplete",
    ]  # fmt: skip
    assert events[-2]["item"]["status"] == "incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
