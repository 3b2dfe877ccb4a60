"""The generated turns a request records, captured for the Responses store.

The chat path remembers each generated assistant turn in bounded memos (reasoning_history.py's
`TurnMemo`, tools/prompt.py's `CallMemo`) so that a turn sent back is rendered as the very tokens
generated. Those memos drop their least recently used entries; a stored response chain
(`previous_response_id`) must not depend on that. While the Responses door serves a request it
sets `CAPTURE`, and every memo record is also kept there as a `Replay`; the stored response holds
its chain's replays and puts them back into the memos before the chain continues.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Replay:
    """One memo record, to be done again: `run()` records the same turn under the same keys."""

    run: Callable[[], None]
    nbytes: int  # what it holds (text and token ids), counted against the store's bound


#: set by the Responses door for the request it serves: the records made while serving it
CAPTURE: contextvars.ContextVar[list[Replay] | None] = contextvars.ContextVar("turn_capture", default=None)


def captured(run: Callable[[], None], text: str, output_ids: tuple[int, ...] | None) -> None:
    """Called by a memo after it records a turn: keep the record where a capture is on."""
    records = CAPTURE.get()
    if records is not None:
        records.append(Replay(run, len(text.encode()) + 8 * len(output_ids or ())))
