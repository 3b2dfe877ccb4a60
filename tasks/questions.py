"""Question and chat-prompt files (JSONL): the I/O edge of the task suites, validated with pydantic.

Questions: one JSON object per line with `question`, optional `answer` (gold: a string, a number, or
a list of acceptable strings; "answers" is accepted as an alias, as in LongBench) and optional `id`
(default "<file stem>-<line>"). Extra keys are kept in `meta` when given as {"meta": {...}} and
ignored otherwise. Chat prompts: `turns`, a list of user messages (one for single-turn), and `id`.
Blank lines are skipped; any malformed line raises TaskInputError naming the file and the line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from tasks.errors import TaskInputError


class _Entry(BaseModel):
    """What every JSONL entry has: a unique `id` and free-form `meta`."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str = Field(min_length=1)
    meta: dict[str, Any] = Field(default_factory=dict)

    @field_validator("id", mode="before")
    @classmethod
    def _id_as_text(cls, value: Any) -> Any:
        # Integer ids are common in hand-written files; keep them, as text.
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


_Model = TypeVar("_Model", bound=_Entry)


class Question(_Entry):
    """One question; `answer` is None (no gold) or the non-empty list of acceptable answers."""

    question: str = Field(min_length=1)
    answer: list[str] | None = Field(default=None, validation_alias=AliasChoices("answer", "answers"))

    @field_validator("question")
    @classmethod
    def _question_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("question is blank")
        return value.strip()

    @field_validator("answer", mode="before")
    @classmethod
    def _answer_as_list(cls, value: Any) -> Any:
        if value is None:
            return None
        values = value if isinstance(value, list) else [value]
        if not values:
            raise ValueError("answer list is empty (omit `answer` when there is no gold)")
        out = []
        for item in values:
            if isinstance(item, bool) or not isinstance(item, str | int | float):
                raise ValueError(f"answer must be a string or number, got {type(item).__name__}")
            if not str(item).strip():
                raise ValueError("answer is blank")
            out.append(str(item).strip())
        return out


class ChatPrompt(_Entry):
    """A chat conversation to replay: `turns` are the user messages, in order."""

    turns: list[str] = Field(min_length=1)

    @field_validator("turns")
    @classmethod
    def _turns_not_blank(cls, value: list[str]) -> list[str]:
        if any(not turn.strip() for turn in value):
            raise ValueError("a turn is blank")
        return value


def load_questions(path: str | Path) -> list[Question]:
    """Questions of a JSONL file, in file order; ids must be unique."""
    return _load_jsonl(Path(path), Question)


def load_chat_prompts(path: str | Path) -> list[ChatPrompt]:
    """Chat prompts of a JSONL file, in file order; ids must be unique."""
    return _load_jsonl(Path(path), ChatPrompt)


def dump_jsonl(path: str | Path, rows: list[BaseModel] | list[dict[str, Any]]) -> None:
    """Write rows as JSONL (UTF-8, one compact object per line, keys in model/insertion order)."""
    lines = []
    for row in rows:
        data = row.model_dump(exclude_defaults=True) if isinstance(row, BaseModel) else row
        lines.append(json.dumps(data, ensure_ascii=False))
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def _load_jsonl(path: Path, model: type[_Model]) -> list[_Model]:
    if not path.is_file():
        raise TaskInputError(path, None, "file not found" if not path.exists() else "not a regular file")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TaskInputError(path, None, f"not UTF-8 text: {exc}") from exc
    items: list[_Model] = []
    seen: dict[str, int] = {}
    # lines end at "\n" (a "\r" before it is JSON whitespace); splitlines would also cut a JSON
    # string at a raw U+2028, U+2029 or U+0085, which JSON allows
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        item = _parse_line(path, number, line, model)
        if item.id in seen:
            raise TaskInputError(path, number, f"duplicate id {item.id!r} (first on line {seen[item.id]})")
        seen[item.id] = number
        items.append(item)
    if not items:
        raise TaskInputError(path, None, "no entries (the file is empty)")
    return items


def _parse_line(path: Path, number: int, line: str, model: type[_Model]) -> _Model:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TaskInputError(path, number, f"invalid JSON: {exc.msg} (column {exc.colno})") from exc
    if not isinstance(data, dict):
        raise TaskInputError(path, number, f"expected a JSON object, got {type(data).__name__}")
    data.setdefault("id", f"{path.stem}-{number}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise TaskInputError(path, number, _describe(exc)) from exc


def _describe(exc: ValidationError) -> str:
    """One readable line per problem: `field: message` (pydantic's own text is multi-line and noisy)."""
    parts = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"]) or "entry"
        parts.append(f"{field}: {error['msg']}")
    return "; ".join(parts)
