"""Task suites and their data: documents, questions, scoring, needle-in-a-haystack generator.

Kept import-light on purpose: runners import `tasks.documents`, `tasks.questions`, `tasks.scoring`
and `tasks.needle` explicitly, so `import tasks` never pulls in pydantic or transformers.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from tasks.errors import TaskInputError

__all__ = ["TaskInputError", "data_path"]


def data_path(name: str) -> Path:
    """Path of a bundled data file or folder under tasks/data (e.g. "reasoning.jsonl", "needle").

    Raises TaskInputError naming what is available when `name` does not exist.
    """
    root = files("tasks").joinpath("data")
    # The package is always installed as plain files (no zip), so a Traversable is a real path.
    path = Path(str(root.joinpath(*Path(name).parts)))
    if not path.exists():
        available = ", ".join(sorted(p.name for p in Path(str(root)).iterdir() if not p.name.startswith(".")))
        raise TaskInputError(path, None, f"no bundled data named {name!r} (available: {available})")
    return path
