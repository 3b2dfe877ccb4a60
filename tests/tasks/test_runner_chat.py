"""The short-chat suite on the real engine: later turns extend earlier ones, outputs are greedy."""

from __future__ import annotations

from typing import Any

import pytest

from tasks.chat import chat, load_chats, render
from tasks.questions import ChatPrompt


def test_render_is_chatml_with_generation_prompt() -> None:
    text = render([("system", "S"), ("user", "hi")])
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_default_chats_mix_single_and_multi_turn() -> None:
    chats = load_chats()
    assert len(chats) == 8 and sum(len(c.turns) > 1 for c in chats) == 4
    assert len(load_chats(3)) == 3


@pytest.mark.slow
def test_multi_turn_chat_on_the_engine(engine: Any) -> None:
    from runtime.backends.embedded import EmbeddedBackend

    backend = EmbeddedBackend(engine)
    conversation = ChatPrompt(id="c1", turns=["Name a colour.", "Another one?"])
    res = chat(backend, conversation, max_new_tokens=6)
    assert res.status == "ok" and len(res.replies) == 2 and len(res.records) == 2
    first, second = res.records
    assert second.prompt_tokens > first.prompt_tokens
    assert second.cached_tokens >= first.prompt_tokens - 1  # the second turn extends the first
    assert second.ideal_cached_tokens >= first.prompt_tokens - 1
    again = chat(backend, conversation, max_new_tokens=6)
    assert again.replies == res.replies  # greedy: replaying gives the same replies
