"""Private at rest: every folder mqbatch creates is 0700 and every file 0600, whatever
the umask (docs/security.md, "Private at rest").

    private_dir(path)                  # mkdir -p, each folder it creates 0700
    private_dir(path, tighten=True)    # and `path` itself 0700 even if it existed (folders mqbatch owns)
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)   # 0600 from the first byte
    write_private(path, data)          # atomic replace (temporary file, fsync, rename), 0600

A mode passed to mkdir/open is only an upper bound (the umask clears bits); with
umask 0 it would be the mode itself, so the mode is set explicitly after creating.
"""

from __future__ import annotations

import os
import pathlib

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: str | os.PathLike, *, tighten: bool = False) -> pathlib.Path:
    """Create `path` and any missing parents, each one it creates 0700. An existing
    folder is left as it is unless `tighten` (then `path` itself becomes 0700)."""
    path = pathlib.Path(path)
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=DIR_MODE)
        except FileExistsError:  # made meanwhile by someone else: not ours to change
            continue
        os.chmod(d, DIR_MODE)
    if tighten and path.is_dir() and not path.is_symlink():
        os.chmod(path, DIR_MODE)
    return path


def open_private(path: str | os.PathLike, flags: int, mode: int = FILE_MODE) -> int:
    """os.open() whose file is `mode` (0600) from the first byte, also if it existed."""
    fd = os.open(path, flags, mode)
    try:
        os.fchmod(fd, mode)
    except OSError:
        os.close(fd)
        raise
    return fd


def write_private(path: str | os.PathLike, data: str | bytes, mode: int = FILE_MODE) -> pathlib.Path:
    """Replace `path` atomically (temporary file, fsync, rename) with `data`, `mode` (0600)
    from the first byte on: a reader never sees a partial or world-readable file."""
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with open(fd, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path
