"""PromptLayout: a frozen head rendered once, then an append-only log of ChatML pieces.

With a backend that accepts token ids, each piece is tokenized on its own (once) and the
model's own `output_ids` stand for its turns, so every prompt is the previous prompt + output
plus new pieces, token for token: the prefix cache can never miss on a re-tokenization.
Without one, the same pieces are joined as text, which extends byte for byte.
"""

from __future__ import annotations

import copy
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent import prompts
from agent.examples import Example, render_examples
from agent.tools import Tool
from runtime.trace.ledger import RewriteNote

Tokenize = Callable[[str], list[int]]
Document = str | tuple[str, str]


@dataclass(frozen=True, slots=True)
class Piece:
    """A span of the prompt: its text, and its token ids in token mode (None in text mode)."""

    text: str
    ids: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class Prompt:
    """A rendered prompt; `ids` is None in text mode."""

    text: str
    ids: list[int] | None


def normalize_document(text: str) -> str:
    """One spelling per document: NFC, LF line ends, no trailing spaces, no outer blank lines."""
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.split("\n")).strip("\n")


def render_head_text(
    system: str,
    tools: Sequence[Tool],
    documents: Sequence[Document],
    dead_end: bool,
    examples: Sequence[Example] = (),
) -> str:
    """The system message (instructions, action protocol, tool schemas, documents), then the
    worked examples as demonstrated turns."""
    content = system.strip()
    if tools:
        content += "\n\n" + prompts.PROTOCOL.format(dead_end=prompts.DEAD_END_LINE if dead_end else "")
        # Sorted by name so that reordering the tools list in code cannot change the prompt.
        specs = "\n".join(t.spec_json() for t in sorted(tools, key=lambda t: t.name))
        content += prompts.TOOLS_SECTION.format(tools=specs)
    if documents:
        content += prompts.DOCUMENTS_SECTION
        for index, doc in enumerate(documents, start=1):
            title, text = doc if isinstance(doc, tuple) else (f"{index}", doc)
            content += prompts.DOCUMENT.format(index=index, title=title, text=normalize_document(text))
    return prompts.MESSAGE.format(role="system", content=content) + render_examples(examples)


class PromptLayout:
    """Head + append-only log. `truncate(mark)` is the only way to shorten it (rollback).

    `system` may be a callable: it is then re-rendered for every prompt (a dynamic head, e.g. a
    clock). That breaks the prefix on purpose-less changes; the trace's `prefix_break` shows it.
    """

    def __init__(
        self,
        system: str | Callable[[], str],
        tools: Sequence[Tool] = (),
        documents: Sequence[Document] = (),
        tokenize: Tokenize | None = None,
        dead_end: bool = False,
        examples: Sequence[Example] = (),
        reasoning_history: str = "preserve",
    ) -> None:
        self._system = system
        #: "template": earlier outputs lose their thinking block when a user message follows
        self._drop_thinking = reasoning_history == "template"
        self._outputs: list[int] = []  # log indexes of the model's outputs
        self._rewrites: list[RewriteNote] = []  # dropped blocks not yet reported
        self._examples = tuple(examples)
        self._tools = tuple(tools)
        self._documents = tuple(documents)
        self._dead_end = dead_end
        self._tokenize = tokenize
        self._head: Piece | None = None if callable(system) else self._head_piece(system)
        self._log: list[Piece] = []
        self._gen = self._piece(prompts.GENERATION_PROMPT)
        self._im_end = self._single_id(prompts.IM_END)

    @property
    def token_mode(self) -> bool:
        return self._tokenize is not None

    def _piece(self, text: str) -> Piece:
        return Piece(text, tuple(self._tokenize(text)) if self._tokenize else None)

    def _single_id(self, text: str) -> int | None:
        ids = self._piece(text).ids
        return ids[0] if ids and len(ids) == 1 else None

    def _head_piece(self, system: str) -> Piece:
        return self._piece(
            render_head_text(system, self._tools, self._documents, self._dead_end, self._examples)
        )

    def system_text(self) -> str:
        """The system instructions as given (rendered now, for a dynamic head)."""
        return self._system if isinstance(self._system, str) else self._system()

    def head(self) -> Piece:
        if self._head is not None:
            return self._head
        return self._head_piece(self._system())  # type: ignore[operator]

    # -- appending ---------------------------------------------------------------------------

    def add_message(self, role: str, content: str) -> None:
        if role == "user" and self._drop_thinking:
            self._strip_thinking()
        self._log.append(self._piece(prompts.MESSAGE.format(role=role, content=content)))

    def _strip_thinking(self) -> None:
        """What a reasoning template (Qwen3's) does to the turns before a new user message."""
        for index in self._outputs:
            if index >= len(self._log):
                continue
            text = self._log[index].text
            start, end = text.find(prompts.THINK_OPEN), text.find(prompts.THINK_CLOSE)
            if start < 0 or end < start:
                continue
            stop = end + len(prompts.THINK_CLOSE)
            self._log[index] = self._piece(text[:start] + text[stop:].lstrip("\n"))
            self._rewrites.append({"message": index, "dropped": text[start:stop]})

    def take_rewrites(self) -> tuple[RewriteNote, ...]:
        """Thinking blocks dropped since the last call (the trace's `template_rewrite`)."""
        out, self._rewrites = tuple(self._rewrites), []
        return out

    def add_assistant(self, text: str, output_ids: Sequence[int]) -> Piece:
        """The model's turn, exactly as generated, after the generation prompt it answered.

        Returns the output's piece (the units the next prompt carries for it)."""
        self._log.append(self._gen)
        ids: tuple[int, ...] | None = None
        if self._tokenize is not None:
            ids = tuple(output_ids) if output_ids else tuple(self._tokenize(text))
        out = Piece(text, ids)
        self._outputs.append(len(self._log))
        self._log.append(out)
        self._log.append(self._close(text, ids))
        return out

    def _close(self, text: str, ids: tuple[int, ...] | None) -> Piece:
        # The output may already end in <|im_end|> (as a stop token id or as text): close only once.
        close_text = "\n" if text.endswith(prompts.IM_END) else prompts.ASSISTANT_CLOSE
        if ids is None:
            return Piece(close_text, None)
        ended = bool(ids) and self._im_end is not None and ids[-1] == self._im_end
        return Piece(close_text, tuple(self._tokenize("\n" if ended else prompts.ASSISTANT_CLOSE)))  # type: ignore[misc]

    # -- rendering / rollback ----------------------------------------------------------------

    def mark(self) -> int:
        return len(self._log)

    def truncate(self, mark: int) -> None:
        if not 0 <= mark <= len(self._log):
            raise ValueError(f"mark {mark} outside the log (0..{len(self._log)})")
        del self._log[mark:]
        self._outputs = [i for i in self._outputs if i < mark]

    def render(self, mark: int | None = None, generation_prompt: bool = True) -> Prompt:
        """Head + log[:mark] (+ the assistant generation prompt)."""
        pieces = [self.head(), *self._log[: len(self._log) if mark is None else mark]]
        if generation_prompt:
            pieces.append(self._gen)
        text = "".join(p.text for p in pieces)
        if self._tokenize is None:
            return Prompt(text, None)
        ids: list[int] = []
        for piece in pieces:
            ids.extend(piece.ids or ())
        return Prompt(text, ids)

    def locate(self, offset: int, decode: Callable[[list[int]], str] | None = None) -> str:
        """Which piece of the current prompt holds unit `offset` (a token in token mode, else a
        character): "system message line 3", "message 4 (user)", "generation prompt"."""
        pieces = [self.head(), *self._log, self._gen]
        start = 0
        for index, piece in enumerate(pieces):
            size = len(piece.ids) if piece.ids is not None else len(piece.text)
            if offset < start + size or index == len(pieces) - 1:
                return self._describe(index, piece, offset - start, decode)
            start += size
        return "end of the prompt"

    def _describe(
        self, index: int, piece: Piece, within: int, decode: Callable[[list[int]], str] | None
    ) -> str:
        if index == len(self._log) + 1:
            return "generation prompt"
        role = (
            piece.text[len(prompts.IM_START) :].split("\n", 1)[0]
            if piece.text.startswith(prompts.IM_START)
            else ""
        )
        if index == 0:
            head = piece.text[:within] if piece.ids is None else self._prefix_text(piece, within, decode)
            return f"system message line {head.count(chr(10))}" if head is not None else "system message"
        return f"message {index} ({role or 'assistant output'})"

    @staticmethod
    def _prefix_text(piece: Piece, within: int, decode: Callable[[list[int]], str] | None) -> str | None:
        if decode is None or piece.ids is None:
            return None
        try:
            return decode(list(piece.ids[:within]))
        except Exception:  # a label is cosmetic: never let it break a run
            return None

    def clone(self) -> PromptLayout:
        """An independent copy sharing the (immutable) head and pieces: fork branches start here."""
        other = copy.copy(self)  # the head, tools, tokenizer and settings are shared as they are
        other._log = list(self._log)
        other._outputs = list(self._outputs)
        other._rewrites = []
        return other
