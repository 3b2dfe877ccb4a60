"""The local tier: one file per page under a directory, bounded in bytes, LRU-evicted.

Writes are atomic: a page is written to a temporary file in its final directory and renamed
into place (`os.replace`), so a reader sees a whole entry or none; a crash can at worst leave a
renamed file whose data never reached the disk, which the codec's length and checksum reject.
Leftover temporary files are removed at start-up. The byte bound holds across restarts: the
index (key -> size, least recently used first) is rebuilt from the directory, oldest first.

Failures (directory unwritable, disk full, a file vanished) never reach the caller: `put`
returns False, `get` None, and each kind is logged once.

Thread-safe: the background writer puts while the engine thread gets and checks presence. A
lock guards the index and byte count only; file I/O runs outside it, and a page that another
thread removes between the index and the read is a miss like any other.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from runtime.cache.tier.store import KVStore
from runtime.private_files import open_private, private_dir

SUFFIX, TMP = ".kv", ".tmp"


class FileStore(KVStore):
    name = "file"

    def __init__(self, root: str | os.PathLike[str], capacity_bytes: int) -> None:
        super().__init__()
        if capacity_bytes <= 0:
            raise ValueError("capacity_bytes must be positive")
        self.root = Path(root)
        self.capacity_bytes = capacity_bytes
        self._index: OrderedDict[str, int] = OrderedDict()
        self._bytes = 0
        self._tmp_ids = itertools.count()
        self._lock = threading.Lock()
        self._scan()

    # ---- start-up -------------------------------------------------------------------------
    def _scan(self) -> None:
        try:
            private_dir(self.root)
            found = []
            for sub in self.root.iterdir():
                if not sub.is_dir():
                    continue
                for f in sub.iterdir():
                    if f.name.endswith(TMP):
                        f.unlink(missing_ok=True)  # an interrupted write
                    elif f.name.endswith(SUFFIX):
                        st = f.stat()
                        found.append((st.st_mtime, f.name[: -len(SUFFIX)], st.st_size))
        except OSError as exc:
            self.warn("scan", "tier directory %s is unusable: %s", self.root, exc)
            return
        for _, key, size in sorted(found):
            self._index[key] = size
            self._bytes += size
        self._shrink(0)

    # ---- the store ------------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        return self.root / key[:2] / (key + SUFFIX)

    def get(self, key: str) -> bytearray | None:
        self.counters.gets += 1
        path = self._path(key)
        try:
            with open(path, "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                buf = bytearray(size)
                got = f.readinto(buf)
        except FileNotFoundError:
            with self._lock:
                self._forget(key)
            self.counters.get_misses += 1
            return None
        except OSError as exc:
            self.counters.get_failures += 1
            self.warn(f"get:{exc.errno}", "tier read of %s failed: %s", path, exc)
            return None
        with self._lock:
            if key in self._index:
                self._index.move_to_end(key)
        self.counters.get_bytes += got or 0
        return buf if got == size else buf[: got or 0]

    def put(self, key: str, blob: bytes) -> bool:
        if len(blob) > self.capacity_bytes:
            return False
        with self._lock:
            self._forget(key)
            self._shrink(len(blob))
            tmp_id = next(self._tmp_ids)
        path = self._path(key)
        tmp = path.with_name(f".{key}.{os.getpid()}.{tmp_id}{TMP}")
        try:
            path.parent.mkdir(mode=0o700, exist_ok=True)
            with open_private(tmp, "wb", buffering=0) as f:
                view, done = memoryview(blob), 0
                while done < len(blob):
                    done += f.write(view[done:])
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            self.counters.put_failures += 1
            reason = "disk full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "cannot write"
            self.warn(f"put:{exc.errno}", "tier directory %s: %s (%s)", self.root, reason, exc)
            return False
        with self._lock:
            self._forget(key)  # adopted by `contains` meanwhile (another process's write)
            self._index[key] = len(blob)
            self._bytes += len(blob)
        self.counters.puts += 1
        self.counters.put_bytes += len(blob)
        return True

    def contains(self, keys: Sequence[str]) -> list[bool]:
        """The index answers; a key another process wrote into the same directory is adopted."""
        out = []
        for key in keys:
            with self._lock:
                present = key in self._index
            if not present:
                try:
                    size = self._path(key).stat().st_size
                except OSError:
                    size = -1
                if size >= 0:
                    with self._lock:
                        self._forget(key)
                        self._index[key] = size
                        self._bytes += size
                    present = True
            out.append(present)
        return out

    def delete(self, key: str) -> None:
        with self._lock:
            self._forget(key)
        self.counters.deletes += 1
        with contextlib.suppress(OSError):
            self._path(key).unlink(missing_ok=True)

    # ---- bookkeeping ----------------------------------------------------------------------
    def _forget(self, key: str) -> None:
        """Under the lock (as `_shrink`)."""
        size = self._index.pop(key, None)
        if size is not None:
            self._bytes -= size

    def _shrink(self, incoming: int) -> None:
        """Evict least recently used entries until `incoming` more bytes fit the bound."""
        while self._index and self._bytes + incoming > self.capacity_bytes:
            key, size = self._index.popitem(last=False)
            self._bytes -= size
            self.counters.evictions += 1
            self.counters.evicted_bytes += size
            with contextlib.suppress(OSError):
                self._path(key).unlink(missing_ok=True)

    def footprint(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._index), "bytes": self._bytes}
