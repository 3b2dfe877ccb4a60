"""One trace line (`StepRecord`, the fields of DESIGN.md "Trace") and the JSONL writer: shared by
the agent SDK and `serve --trace-dir`."""

from __future__ import annotations

import io
import json
import threading
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, TextIO

from runtime.private_files import open_private
from runtime.trace.ledger import PrefixBreak

#: fields a trace written before they existed may lack (read with these defaults)
OPTIONAL_FIELDS: dict[str, None] = {"miss": None}


@dataclass(slots=True)
class StepRecord:
    """One model call, exactly the trace fields of DESIGN.md ("Trace")."""

    run_id: str
    session_id: str
    branch: int
    step: int
    kind: str
    prompt_tokens: int
    cached_tokens: int
    ideal_cached_tokens: int
    completion_tokens: int
    ttft_s: float
    latency_s: float
    finish_reason: str
    prefix_break: PrefixBreak | None
    tool: dict[str, object] | None
    #: uncached prompt tokens by cause (runtime/trace/ledger.py MISS_CAUSES), summing to prompt - cached
    miss: dict[str, int] | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False, ensure_ascii=False, default=str)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepRecord:
        names = {f.name for f in fields(cls)}
        data = {**OPTIONAL_FIELDS, **data}
        missing = names - data.keys()
        if missing:
            raise ValueError(f"trace record lacks {sorted(missing)}")
        return cls(**{k: data[k] for k in names})


class TraceWriter:
    """Appends one JSON line per step and flushes it at once (a crash loses at most one step)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # traces hold prompts: 0600 (`serve --trace-dir` also makes its directory 0700)
        self._file: TextIO | None = io.TextIOWrapper(open_private(self.path, "ab"), encoding="utf-8")

    def write(self, record: StepRecord) -> None:
        self.write_line(record.to_json())

    def write_line(self, line: str) -> None:
        with self._lock:
            if self._file is None:
                raise ValueError(f"trace {self.path} is closed")
            self._file.write(line + "\n")
            self._file.flush()

    def size(self) -> int:
        with self._lock:
            return self._file.tell() if self._file is not None else 0

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
