"""Typed errors of the tasks layer. Callers branch on the type, never on the message."""

from __future__ import annotations

from pathlib import Path


class TaskInputError(ValueError):
    """A task input (document, questions file, bundled data) is missing or malformed.

    `path` names the file, `line` the 1-based line when one line is to blame (None for the whole
    file), `message` says what is wrong. str() reads like a compiler error: `path:line: message`.
    """

    def __init__(self, path: str | Path, line: int | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.message = message
        super().__init__(self.__str__())

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.message}"

    def __reduce__(self) -> tuple[type[TaskInputError], tuple[str, int | None, str]]:
        # Keeps the error picklable (multiprocessing, pytest-xdist) despite the custom __init__.
        return (type(self), (self.path, self.line, self.message))
