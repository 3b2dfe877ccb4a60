"""Files only the server's own user may read: tier pages decode back to prompt text and traces hold
prompts, so both live in 0700 directories as 0600 files (a 0644 file was readable by every local
user)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """`path` as a directory only its owner can enter (created 0700; tightened when it is ours)."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid == os.getuid() and st.st_mode & 0o077:
        path.chmod(DIR_MODE)
    return path


def open_private(path: Path, mode: str = "wb", buffering: int = -1) -> IO:
    """`open(path, mode)` for writing or appending, creating the file 0600 (existing ones tightened)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        return os.fdopen(fd, mode, buffering=buffering)
    except BaseException:
        os.close(fd)
        raise


def key_file(path: Path) -> bytes:
    """32 random bytes kept at `path` (0600 in a 0700 directory), created on first use."""
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        key = path.read_bytes()
        if len(key) != 32:
            raise ValueError(f"{path}: not a tier key (remove it to make a new one)") from None
        return key
    key = os.urandom(32)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key
