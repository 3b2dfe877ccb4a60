"""The files of `serve --trace-dir`: one JSONL file per tenant, under three bounds that degrade by
dropping trace lines (counted), never by failing a request.

- open files: at most `max_open_files` writers are open (least recently written closed first and
  reopened on their next line), so many tenants cannot exhaust the process's descriptors;
- disk: the directory's trace files stay under `max_total_bytes`: rotated files (`.1` ... `.keep`)
  are deleted oldest first to make room, and a line that still does not fit is dropped;
- size per file: past `max_bytes` a file is rotated.

Files are 0600 in a 0700 directory (runtime/private_files.py): traces hold prompts.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from runtime.private_files import private_dir
from runtime.trace.record import TraceWriter

log = logging.getLogger("radixagent.trace_dir")


@dataclass(frozen=True, slots=True)
class FileBounds:
    max_bytes: int = 16 * 2**20
    keep: int = 3
    max_open_files: int = 64
    max_total_bytes: int = 1 * 2**30

    def __post_init__(self) -> None:
        if self.max_bytes < 4096 or self.keep < 1 or self.max_open_files < 1:
            raise ValueError("trace dir: max_bytes >= 4096, keep >= 1, max_open_files >= 1")
        if self.max_total_bytes < self.max_bytes:
            raise ValueError("trace dir: max_total_bytes must be >= max_bytes")


@dataclass
class FileCounters:
    dropped_lines: int = 0  # not written: no disk budget left, or the write failed
    write_errors: int = 0
    deleted_files: int = 0  # rotated files removed to stay under the disk budget


@dataclass
class TraceFiles:
    """Not thread-safe: the caller (TraceDir) holds its lock."""

    root: Path
    bounds: FileBounds
    counters: FileCounters = field(default_factory=FileCounters)
    _writers: OrderedDict[str, TraceWriter] = field(default_factory=OrderedDict)
    _disk: int = 0

    def __post_init__(self) -> None:
        private_dir(self.root)
        self._disk = sum(p.stat().st_size for p in self._files())

    def write(self, tenant: str, line: str) -> bool:
        """Append one line to the tenant's file; False when it was dropped (counted)."""
        size = len(line.encode()) + 1
        if not self._make_room(size):
            return self._drop("the trace directory is at its disk budget")
        try:
            writer = self._writer(tenant)
            writer.write_line(line)
        except OSError as exc:
            self.counters.write_errors += 1
            self._close(tenant)
            return self._drop(f"cannot write {tenant}.jsonl: {exc.strerror or exc}")
        self._disk += size
        if writer.size() >= self.bounds.max_bytes:
            self._close(tenant)
            self._rotate(self.path(tenant))
        return True

    def path(self, tenant: str) -> Path:
        return self.root / f"{tenant}.jsonl"

    def stats(self) -> dict[str, int]:
        return {
            "open_files": len(self._writers),
            "disk_bytes": self._disk,
            "dropped_lines": self.counters.dropped_lines,
            "write_errors": self.counters.write_errors,
            "deleted_files": self.counters.deleted_files,
        }

    def close(self) -> None:
        for tenant in list(self._writers):
            self._close(tenant)

    def _writer(self, tenant: str) -> TraceWriter:
        writer = self._writers.get(tenant)
        if writer is None:
            while len(self._writers) >= self.bounds.max_open_files:
                self._close(next(iter(self._writers)))
            writer = self._writers[tenant] = TraceWriter(self.path(tenant))
        self._writers.move_to_end(tenant)
        return writer

    def _close(self, tenant: str) -> None:
        writer = self._writers.pop(tenant, None)
        if writer is not None:
            writer.close()

    def _drop(self, why: str) -> bool:
        self.counters.dropped_lines += 1
        if self.counters.dropped_lines in (1, 10, 100) or self.counters.dropped_lines % 10_000 == 0:
            log.warning("trace line dropped (%d so far): %s", self.counters.dropped_lines, why)
        return False

    def _make_room(self, size: int) -> bool:
        """Delete rotated files, oldest first, until `size` more bytes fit the disk budget."""
        if self._disk + size <= self.bounds.max_total_bytes:
            return True
        rotated = sorted((p for p in self._files() if not p.name.endswith(".jsonl")), key=_mtime)
        for old in rotated:
            try:
                freed = old.stat().st_size
                old.unlink()
            except OSError:
                continue
            self._disk -= freed
            self.counters.deleted_files += 1
            if self._disk + size <= self.bounds.max_total_bytes:
                return True
        return False

    def _rotate(self, path: Path) -> None:
        last = path.with_name(f"{path.name}.{self.bounds.keep}")
        if last.exists():
            self._disk -= last.stat().st_size
            last.unlink()
        for index in range(self.bounds.keep - 1, 0, -1):
            older = path.with_name(f"{path.name}.{index}")
            if older.exists():
                older.replace(path.with_name(f"{path.name}.{index + 1}"))
        path.replace(path.with_name(f"{path.name}.1"))

    def _files(self) -> list[Path]:
        return [p for p in self.root.iterdir() if ".jsonl" in p.name and p.is_file()]


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
