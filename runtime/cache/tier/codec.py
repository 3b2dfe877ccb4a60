"""One stored page: a header, a MAC, then the raw planes. Decoding verifies everything it can.

Layout: MAGIC (4 bytes) | header length (u32 LE) | header (JSON) | MAC (32 bytes) | payload.
The header names the key, the KV format, each plane's dtype and shape and the payload length.
The MAC is keyed BLAKE2b over the header and the payload with the server's tier key (`mac_key`):
a checksum anyone can recompute let a forged page be served and change outputs. `decode` rejects
(raises `CorruptEntry`) a wrong magic, a key other than the one asked for (a misplaced or renamed
file), another format, a short or long payload (a truncated write) or a MAC that does not verify
(a forged or damaged page, or one another key wrote): a bad entry is recomputed, never served.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from collections.abc import Sequence

import torch

from runtime.cache.tier.store import CorruptEntry

MAGIC = b"RAK2"  # RAKV pages (CRC-32 only) are refused: recomputed once, then rewritten
MAC_BYTES = 32
_LEN = struct.Struct("<I")
_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.int8)}


def _mac(mac_key: bytes, head: bytes | memoryview, payload: Sequence[bytes | memoryview]) -> bytes:
    h = hashlib.blake2b(key=mac_key, digest_size=MAC_BYTES, person=b"radixagent-kv")
    h.update(_LEN.pack(len(head)))
    h.update(head)
    for part in payload:
        h.update(part)
    return h.digest()


def encode(key: str, fmt: str, planes: Sequence[torch.Tensor], mac_key: bytes) -> bytes:
    """`planes`: one page's K/V, each [layers, kv_heads, tokens, x] (any strides)."""
    raw = [p.contiguous().view(torch.uint8).reshape(-1).numpy() for p in planes]
    header = {
        "key": key,
        "fmt": fmt,
        "planes": [[str(p.dtype), list(p.shape)] for p in planes],
        "nbytes": sum(r.nbytes for r in raw),
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    mac = _mac(mac_key, head, [r.data for r in raw])
    # join takes the arrays' buffers as they are: one copy of the planes, not two
    return b"".join([MAGIC, _LEN.pack(len(head)), head, mac, *(r.data for r in raw)])


def decode(key: str, fmt: str, blob: bytes | bytearray | memoryview, mac_key: bytes) -> list[torch.Tensor]:
    """The planes stored under `key`, or CorruptEntry. Tensors share `blob`'s memory when it is
    writable (a bytearray): no copy before they are written into the pool."""
    view = memoryview(blob)
    header, head_end = _header(view)
    start = head_end + MAC_BYTES
    if start > len(view):
        raise CorruptEntry("no MAC (truncated)")
    if header.get("key") != key:
        raise CorruptEntry(f"entry holds key {str(header.get('key'))[:16]}..., not {key[:16]}...")
    if header.get("fmt") != fmt:
        raise CorruptEntry(f"entry is KV format {header.get('fmt')!r}, the engine stores {fmt!r}")
    payload = view[start:]
    if len(payload) != header.get("nbytes"):
        raise CorruptEntry(
            f"payload is {len(payload)} bytes, header says {header.get('nbytes')} (truncated?)"
        )
    expected = _mac(mac_key, view[8:head_end], [payload])
    if not hmac.compare_digest(expected, bytes(view[head_end:start])):
        raise CorruptEntry("page MAC does not verify (forged, damaged, or written under another tier key)")
    return _planes(header, payload)


def _header(view: memoryview) -> tuple[dict, int]:
    if len(view) < 8 or bytes(view[:4]) != MAGIC:
        raise CorruptEntry("not a KV page (bad magic or empty)")
    (n,) = _LEN.unpack(view[4:8])
    if 8 + n > len(view):
        raise CorruptEntry("header runs past the end (truncated)")
    try:
        header = json.loads(bytes(view[8 : 8 + n]))
    except ValueError as exc:
        raise CorruptEntry(f"unreadable header: {exc}") from None
    if not isinstance(header, dict):
        raise CorruptEntry("header is not an object")
    return header, 8 + n


def _planes(header: dict, payload: memoryview) -> list[torch.Tensor]:
    buf = payload if not payload.readonly else memoryview(bytearray(payload))
    out, pos = [], 0
    try:
        for dtype_name, shape in header["planes"]:
            dtype = _DTYPES[dtype_name]
            count = 1
            for d in shape:
                count *= int(d)
            size = count * torch.empty(0, dtype=dtype).element_size()
            flat = torch.frombuffer(buf, dtype=torch.uint8, count=size, offset=pos)
            out.append(flat.view(dtype).reshape(shape))
            pos += size
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CorruptEntry(f"bad plane description: {exc}") from None
    if pos != len(payload):
        raise CorruptEntry("planes do not cover the payload")
    return out
