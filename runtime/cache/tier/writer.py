"""Background writes: the engine thread hands page snapshots to a writer thread that encodes
and stores them, so eviction never waits on the disk or the network.

- `submit(key, planes)`: called on the engine thread with planes already copied out of the pool
  (the slots are freed right after). Queued when the queue's bytes stay within `max_bytes`;
  otherwise refused (False, counted as dropped): the engine never blocks on a slow store.
- A page is *pending* from `submit` until its `put` has finished (stored or failed). `pending`
  serves its planes from memory, so a fetch never races a write: it finds the page either in
  the queue or in the store, and a page whose write failed is in neither (recomputed).
- `close(flush=True)` writes what is queued (bounded by a timeout), drops the rest (counted) and
  joins the thread. Stores write atomically, so a write cut short leaves no torn entry.

Counters are guarded by the writer's lock: the engine thread reads them for stats.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from runtime.cache.tier.store import KVStore, log

#: default bound on the queue (MiB): one 2k-token prefix of the bundled model in float32 (~94 MB)
DEFAULT_QUEUE_MB = 128

Encode = Callable[[str, Sequence[torch.Tensor]], bytes]


@dataclass(slots=True)
class WriterCounters:
    queued_pages: int = 0
    written_pages: int = 0
    written_bytes: int = 0  # encoded bytes the store accepted
    failed_pages: int = 0  # the store refused the put (full, unwritable, down)
    dropped_pages: int = 0  # refused at submit: the queue was full (or closed)
    dropped_on_close: int = 0  # still queued when close gave up waiting
    queue_bytes: int = 0  # snapshot bytes queued now (pending pages, the one in flight included)
    peak_queue_bytes: int = 0
    write_time_s: float = 0.0  # writer-thread seconds in encode + put


@dataclass(slots=True)
class _Page:
    planes: Sequence[torch.Tensor]
    nbytes: int


def snapshot_bytes(planes: Sequence[torch.Tensor]) -> int:
    return sum(p.numel() * p.element_size() for p in planes)


class PageWriter:
    def __init__(self, store: KVStore, encode: Encode, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.store, self.encode, self.max_bytes = store, encode, max_bytes
        self.counters = WriterCounters()
        self._pending: OrderedDict[str, _Page] = OrderedDict()  # oldest first; the head may be in flight
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a page queued, finished, or closing
        self._closed = False
        self._thread: threading.Thread | None = None

    # ---- the engine thread ----------------------------------------------------------------
    def submit(self, key: str, planes: Sequence[torch.Tensor]) -> bool:
        """Queue one page's planes (already copies, never views of the pool). False: dropped."""
        nbytes = snapshot_bytes(planes)
        with self._lock:
            if key in self._pending:
                return True
            c = self.counters
            if self._closed or c.queue_bytes + nbytes > self.max_bytes:
                c.dropped_pages += 1
                return False
            self._pending[key] = _Page(planes, nbytes)
            c.queued_pages += 1
            c.queue_bytes += nbytes
            c.peak_queue_bytes = max(c.peak_queue_bytes, c.queue_bytes)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="radixagent-tier-writer", daemon=True)
                self._thread.start()
            self._changed.notify_all()
        return True

    def pending(self, key: str) -> Sequence[torch.Tensor] | None:
        """The planes of a page not yet written (None: not pending)."""
        with self._lock:
            page = self._pending.get(key)
            return None if page is None else page.planes

    def pending_of(self, keys: Sequence[str]) -> list[bool]:
        with self._lock:
            return [k in self._pending for k in keys]

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued page is written (or failed); False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def close(self, flush: bool = True, timeout_s: float = 30.0) -> None:
        """Stop accepting pages; write the queue (up to `timeout_s`) or drop it; join the thread."""
        if flush:
            self.flush(timeout_s)
        with self._lock:
            self._closed = True
            thread = self._thread
            # what is left is dropped; the head may be in flight: its put finishes (atomically)
            left = list(self._pending)[1:] if thread is not None else list(self._pending)
            for key in left:
                page = self._pending.pop(key)
                self.counters.queue_bytes -= page.nbytes
                self.counters.dropped_on_close += 1
            self._changed.notify_all()
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("tier writer still busy %.0f s after close", timeout_s)

    def stats(self) -> dict[str, int | float]:
        with self._lock:
            c = self.counters
            out: dict[str, int | float] = {f: getattr(c, f) for f in c.__dataclass_fields__}
        out["max_queue_bytes"] = self.max_bytes
        return out

    # ---- the writer thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._changed.wait()
                if not self._pending:
                    return  # closed and drained
                key, page = next(iter(self._pending.items()))  # stays pending while in flight
            began = time.perf_counter()
            ok = self._write(key, page)
            with self._lock:
                self._pending.pop(key, None)
                c = self.counters
                c.queue_bytes -= page.nbytes
                c.write_time_s += time.perf_counter() - began
                if ok is None:
                    c.failed_pages += 1
                else:
                    c.written_pages += 1
                    c.written_bytes += ok
                self._changed.notify_all()

    def _write(self, key: str, page: _Page) -> int | None:
        """Encoded bytes stored, or None when the store refused or encoding failed."""
        try:
            blob = self.encode(key, page.planes)
            return len(blob) if self.store.put(key, blob) else None
        except Exception as exc:  # a bug here must not kill the writer: the page is recomputed later
            self.store.warn("writer", "tier writer failed on %s...: %s", key[:16], exc)
            return None
