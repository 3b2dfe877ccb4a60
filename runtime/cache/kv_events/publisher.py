"""The ZMQ publisher thread: turns the recorder's tree changes into SGLang's event batches.

One thread owns both sockets: a PUB socket (`endpoint`) sending `(topic, seq, payload)` per
batch, and, with `replay_endpoint`, a ROUTER socket that answers a request `[b"", start_seq as 8
bytes big-endian]` (what a DEALER sends; a REQ socket adds the empty frame itself) with every
buffered batch from that sequence number on, each `[b"", topic, seq, payload]`, then the end
marker `[b"", b"", seq -1, b""]`: SGLang's replay protocol. A batch holds what the engine changed
since the previous batch (the thread drains the queue, hashes, coalesces), as SGLang publishes
once per scheduler step.

The engine's thread never waits on this one: it only offers changes to a bounded queue.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque

import msgspec
import zmq

from runtime.cache.kv_events.config import KVEventsConfig
from runtime.cache.kv_events.hashing import block_hash, namespace_seed, namespaced, page_digests
from runtime.cache.kv_events.recorder import Change, KVEventRecorder
from runtime.cache.kv_events.schema import (
    MEDIUM_POOL,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    EventBatch,
    coalesce,
)

log = logging.getLogger("radixagent.kv_events")
END_SEQ = (-1).to_bytes(8, "big", signed=True)
#: most tree changes folded into one batch
_BATCH_CHANGES = 512


def to_event(change: Change, block_size: int, dynamo: bool) -> Event:
    """The SGLang event for one recorded tree change (hashing runs here, off the engine thread)."""
    if change.kind == "clear":
        return AllBlocksCleared()
    digests = page_digests(change.tokens, block_size, change.cache_salt)
    seed = namespace_seed(change.extra_key, change.cache_salt) if dynamo else None
    hashes = [namespaced(block_hash(d), seed) for d in digests[change.first_page :]]
    if change.kind == "remove":
        return BlockRemoved(block_hashes=hashes, medium=MEDIUM_POOL)
    first = change.first_page
    parent = namespaced(block_hash(digests[first - 1]), seed) if first else None
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=list(change.tokens[first * block_size :]),
        block_size=block_size,
        lora_id=None,
        medium=MEDIUM_POOL,
        cache_salt=change.cache_salt,
        session_id=change.session_id,
    )


class ZmqEventPublisher:
    """Started by `start()`; `close()` stops the thread and closes the sockets."""

    def __init__(self, config: KVEventsConfig, recorder: KVEventRecorder) -> None:
        self.config = config
        self.recorder = recorder
        self.published = 0  # batches sent
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._replay: zmq.Socket | None = None
        try:
            if config.binds():
                self._pub.bind(config.endpoint)
            else:
                self._pub.connect(config.endpoint)
            if config.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.bind(config.replay_endpoint)
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise ValueError(f"--kv-events-config: cannot open {config.endpoint}: {exc}") from None
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._topic = config.topic.encode("utf-8")
        self._seq = 0
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="kv-events", daemon=True)

    def start(self) -> ZmqEventPublisher:
        self._thread.start()
        log.info(
            "KV events: %s %s (topic %r, block size %d, format %s%s)",
            "bound" if self.config.binds() else "connected",
            self.config.endpoint,
            self.config.topic,
            self.recorder.block_size,
            self.config.format,
            f", replay on {self.config.replay_endpoint}" if self._replay is not None else "",
        )
        return self

    def bound_endpoint(self) -> str:
        """The PUB socket's actual address (resolves a port 0 bind)."""
        return self._pub.getsockopt_string(zmq.LAST_ENDPOINT)

    def describe(self) -> dict[str, object] | None:
        """SGLang's `kv_events` block of /get_server_info (what smg's event-aware policy reads to
        subscribe): None unless the PUB socket is a bound tcp:// address."""
        if not self.config.binds() or not self.config.endpoint.startswith("tcp://"):
            return None
        host = self.config.endpoint[len("tcp://") :].rsplit(":", 1)[0]
        out: dict[str, object] = {
            "publisher": self.config.publisher,
            "endpoint_host": host,
            "endpoint_port_base": int(self.bound_endpoint().rsplit(":", 1)[1]),
            "topic": self.config.topic,
            "block_size": self.recorder.block_size,
            "dp_size": 1,
        }
        if self._replay is not None and self.config.replay_endpoint is not None:
            bound = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
            if bound.startswith("tcp://"):
                out["replay_endpoint_port_base"] = int(bound.rsplit(":", 1)[1])
        return out

    def stats(self) -> dict[str, int]:
        return {
            "kv_events_recorded": self.recorder.recorded,
            "kv_events_dropped": self.recorder.dropped,
            "kv_events_batches": self.published,
        }

    def close(self, timeout_s: float = 2.0) -> None:
        """Publish what is queued (up to `timeout_s`), then stop and close."""
        self._running = False
        self._thread.join(timeout=timeout_s)
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()

    # ---- the thread -----------------------------------------------------------------------
    def _loop(self) -> None:
        encoder = msgspec.msgpack.Encoder()
        changes = self.recorder.changes
        while self._running or not changes.empty():
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                first = changes.get(timeout=0.05)
            except queue.Empty:
                continue
            batch = [first]
            while len(batch) < _BATCH_CHANGES:
                try:
                    batch.append(changes.get_nowait())
                except queue.Empty:
                    break
            try:
                self._send(encoder, batch)
            except Exception:  # a failing send must not kill the thread; the batch is lost
                log.exception("KV events: publishing a batch failed")
                time.sleep(0.1)

    def _send(self, encoder: msgspec.msgpack.Encoder, batch: list[Change]) -> None:
        events: list[Event] = []
        bs, dynamo = self.recorder.block_size, self.config.dynamo
        for change in batch:
            coalesce(events, to_event(change, bs, dynamo))
        payload = encoder.encode(EventBatch(ts=time.time(), events=events, attn_dp_rank=0))
        seq = self._seq
        self._seq += 1
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))
        self.published += 1

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            log.warning("KV events: malformed replay request (%d frames)", len(frames))
            return
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= start_seq:
                self._replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))


def start_publisher(config: KVEventsConfig, block_size: int, roots: dict) -> ZmqEventPublisher:
    """A recorder for the tree whose namespace roots are `roots`, and its running publisher."""
    recorder = KVEventRecorder(block_size, config.max_queue_size, roots)
    return ZmqEventPublisher(config, recorder).start()
