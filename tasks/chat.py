"""Short chat: single- and multi-turn conversations with little shared prefix (the cache's overhead).

Plain backend calls, no agent: each turn is the conversation so far in the model's ChatML template
(system, then user/assistant turns) as text, answered greedily. Later turns of a conversation extend
the earlier ones, so only they can hit the cache; single-turn chats share just the short system turn.
Each call becomes a StepRecord (kind "answer") so chats read like agent traces.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from agent import StepRecord
from agent.prompts import GENERATION_PROMPT, IM_END, MESSAGE
from agent.trace import SessionLedger
from runtime.backends.base import Backend, Completion
from runtime.errors import RadixAgentError
from tasks import prompts
from tasks.backend_setup import GREEDY, with_cache
from tasks.outcomes import ItemOutcome, SuiteOptions, SuiteOutcome
from tasks.output import progress_bar
from tasks.questions import ChatPrompt

CHAT_MAX_NEW_TOKENS = 48
DEFAULT_CHATS = 8  # the suite's default size: 4 single-turn and 4 multi-turn conversations


@dataclass(slots=True)
class ChatResult:
    chat: ChatPrompt
    replies: list[str] = field(default_factory=list)
    records: list[StepRecord] = field(default_factory=list)
    status: str = "ok"


def render(messages: list[tuple[str, str]]) -> str:
    """ChatML text of `messages` plus the assistant generation prompt."""
    return (
        "".join(MESSAGE.format(role=role, content=content) for role, content in messages) + GENERATION_PROMPT
    )


def _record(session: str, step: int, completion: Completion, ideal: int) -> StepRecord:
    return StepRecord(
        run_id=session,
        session_id=session,
        branch=0,
        step=step,
        kind="answer",
        prompt_tokens=completion.prompt_tokens,
        cached_tokens=completion.cached_tokens,
        ideal_cached_tokens=ideal,
        completion_tokens=completion.completion_tokens,
        ttft_s=completion.ttft_s,
        latency_s=completion.latency_s,
        finish_reason=completion.finish_reason,
        prefix_break=None,
        tool=None,
    )


def _units(backend: Backend, text: str) -> list[int] | None:
    return backend.tokenize(text) if backend.can_tokenize else None


def chat(
    backend: Backend,
    conversation: ChatPrompt,
    *,
    max_new_tokens: int = CHAT_MAX_NEW_TOKENS,
    on_turn: Callable[[ChatPrompt, StepRecord], None] | None = None,
) -> ChatResult:
    """Replay one conversation's user turns, each answered with the history so far."""
    session = f"chat-{uuid.uuid4().hex[:12]}"
    ledger = SessionLedger()
    messages: list[tuple[str, str]] = [("system", prompts.CHAT_SYSTEM)]
    result = ChatResult(conversation)
    params = {**GREEDY, "max_new_tokens": max_new_tokens}
    for step, turn in enumerate(conversation.turns):
        messages.append(("user", turn))
        prompt = render(messages)
        try:
            completion = backend.generate(
                prompt=prompt, sampling_params=params, session_id=session, rid=f"{session}-t{step}"
            )
        except RadixAgentError:
            result.status = "error"
            break
        units = _units(backend, prompt)
        ideal = ledger.ideal(units) if units is not None else 0
        if units is not None:
            ledger.record(0, units, completion.output_ids)
        record = _record(session, step, completion, ideal)
        result.records.append(record)
        reply = completion.text.removesuffix(IM_END).strip()
        result.replies.append(reply)
        messages.append(("assistant", reply))
        if on_turn is not None:
            on_turn(conversation, record)
    return result


def load_chats(limit: int | None = None) -> list[ChatPrompt]:
    """Bundled chats, single- and multi-turn interleaved (s1, m1, s2, m2, ...), the first `limit`."""
    from tasks import data_path
    from tasks.questions import load_chat_prompts

    chats = load_chat_prompts(data_path("chat.jsonl"))
    single = [c for c in chats if len(c.turns) == 1]
    multi = [c for c in chats if len(c.turns) > 1]
    mixed = [c for pair in zip(single, multi, strict=False) for c in pair]
    mixed += single[len(multi) :] + multi[len(single) :]
    return mixed[: limit or DEFAULT_CHATS]


def run_chat_suite(backend: Backend, options: SuiteOptions) -> SuiteOutcome:
    """The eval's "chat" suite: `options.limit` conversations (default DEFAULT_CHATS), in file order."""

    backend = with_cache(backend, options.prefix_cache)
    chats = load_chats(options.limit)
    items: list[ItemOutcome] = []
    started = time.perf_counter()
    with progress_bar(options.progress, "chat", len(chats)) as advance:
        for conversation in chats:
            res = chat(backend, conversation)
            answer = res.replies[-1] if res.replies else None
            items.append(ItemOutcome(conversation.id, answer, None, res.status, res.records))
            advance()
    return SuiteOutcome("chat", items, time.perf_counter() - started)
