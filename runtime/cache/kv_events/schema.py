"""The wire schema of SGLang 0.5.23's KV events (sglang/srt/disaggregation/kv_events.py), as
msgspec structs of our own with the same encoding, so SGLang's and vLLM's consumers decode it:

- a batch is a msgpack array `[ts, events, attn_dp_rank]` (ts: float seconds since the epoch);
- each event is a msgpack map tagged by its class name under `type`; fields equal to their
  default (None) are left out;
- `BlockStored {block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium?,
  cache_salt?, session_id?, lora_name?}`, `BlockRemoved {block_hashes, medium?}`,
  `AllBlocksCleared {}`.

On the socket each batch is one multipart message `(topic, seq as 8 bytes big-endian, payload)`.
"""

from __future__ import annotations

import msgspec

#: SGLang's StorageMedium values; the embedded engine's pool is the first tier ("GPU" is the name
#: SGLang gives it on every device, its CPU server included)
MEDIUM_POOL = "GPU"


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the tagged events."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    attn_dp_rank: int | None = None


def decoder() -> msgspec.msgpack.Decoder:
    """A decoder for what the publisher sends (consumers and tests)."""
    return msgspec.msgpack.Decoder(EventBatch)


def coalesce(events: list[Event], event: Event) -> None:
    """Append `event`, merged into the last one where SGLang's recorder merges: removals of the
    same medium, and stores continuing the previous store's chain with the same attributes."""
    tail = events[-1] if events else None
    if isinstance(tail, BlockRemoved) and isinstance(event, BlockRemoved) and tail.medium == event.medium:
        tail.block_hashes.extend(event.block_hashes)
        return
    if (
        isinstance(tail, BlockStored)
        and isinstance(event, BlockStored)
        and tail.block_hashes
        and event.parent_block_hash == tail.block_hashes[-1]
        and (tail.medium, tail.block_size, tail.cache_salt, tail.session_id)
        == (event.medium, event.block_size, event.cache_salt, event.session_id)
    ):
        tail.block_hashes.extend(event.block_hashes)
        tail.token_ids.extend(event.token_ids)
        return
    events.append(event)
