"""Run and build directories mqbatch may wipe: only ones it made itself; and a lock
so that two runs never share one.

    fresh_dir(path, "mqbatch demo")            # empty path for a new run, or DirNotOurs
    with claim_dir(path, "mqbatch demo") as d:  # the same, locked until the block ends
        ...                                     # (a second run: DirInUse naming the pid)
    with lock_dir(path, "mqbatch fleet run"):   # locked, not wiped (content kept across runs)
        ...

A directory is wiped only when it is empty or holds the marker file that
fresh_dir() writes into every directory it makes; a user's folder (anything
else) is refused with an error that names it. One helper for every command
that removes a folder (demo, devices, deploy).

The lock is an flock(2) on LOCK_FILE inside the directory, held by an open file
descriptor: the kernel releases it when the process ends, however it ends (a
crash or SIGKILL never leaves a stale lock). The file holds the holder's pid and
command, for the message a second run prints; it is kept across wipes (removing
it would let a third run lock a new file of the same name)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import shutil
from collections.abc import Iterator

from mqbatch.util.private import private_dir, write_private

MARKER = ".mqbatch-run"
LOCK_FILE = ".mqbatch-lock"
LEGACY_MARKERS = (".mqbatch-build",)  # what `mqbatch deploy` wrote into its build directories


class DirNotOurs(RuntimeError):
    """The directory holds files mqbatch did not create: it is not wiped."""


class DirInUse(RuntimeError):
    """Another live process holds the directory's lock."""


def is_ours(path: pathlib.Path) -> bool:
    return any((path / m).is_file() for m in (MARKER, *LEGACY_MARKERS))


def _check(path: pathlib.Path, flag: str, known: frozenset[str]) -> bool:
    """DirNotOurs unless `path` is absent, empty, ours, or holds only `known` entries.
    Returns whether it exists."""
    if not (path.exists() or path.is_symlink()):
        return False
    if not path.is_dir() or path.is_symlink():
        raise DirNotOurs(
            f"{path} exists and is not a plain directory (a file or a symlink): nothing was deleted; "
            f"choose another {flag}"
        )
    names = {p.name for p in path.iterdir()} - {LOCK_FILE}
    if names and not is_ours(path) and not (known and names <= known):
        raise DirNotOurs(
            f"{path} is not empty and was not made by mqbatch (no {MARKER} file): "
            f"nothing was deleted; choose another {flag} or empty it yourself"
        )
    return True


def _wipe(path: pathlib.Path, keep: str | None = None) -> None:
    for child in path.iterdir():
        if child.name == keep:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _mark(path: pathlib.Path, owner: str) -> None:
    write_private(path / MARKER, f"made by {owner}; wiped at its next run\n")


def fresh_dir(
    path: pathlib.Path, owner: str, flag: str = "--run-dir", known: frozenset[str] = frozenset()
) -> pathlib.Path:
    """Make `path` an empty directory marked as made by `owner` (e.g. "mqbatch demo").
    An existing directory is wiped only if it is empty, marked, or holds nothing but
    entries named in `known` (what `owner` writes: a run of a version before the
    marker); otherwise DirNotOurs (the message names the folder and the `flag`).
    Not locked: see claim_dir() for a directory a long run works in."""
    path = pathlib.Path(path)
    if _check(path, flag, known):
        shutil.rmtree(path)
    private_dir(path, tighten=True)  # 0700, and its files 0600 (docs/security.md, "Private at rest")
    write_private(path / MARKER, f"made by {owner}; wiped at its next run\n")
    return path


def _holder(lock: pathlib.Path) -> str:
    try:
        text = lock.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        text = ""
    return text or "a process that has not written its pid yet"


@contextlib.contextmanager
def _locked(path: pathlib.Path, owner: str, flag: str) -> Iterator[int]:
    """An exclusive flock on path/LOCK_FILE (pid and owner written in it) while the block runs."""
    lock = path / LOCK_FILE
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DirInUse(
                f"{path} is in use by {_holder(lock)}: wait for it to end, or choose another {flag}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({owner})\n".encode(), 0)
        yield fd
    finally:
        os.close(fd)  # releases the flock


@contextlib.contextmanager
def lock_dir(path: pathlib.Path, owner: str, flag: str = "--run-dir") -> Iterator[pathlib.Path]:
    """The lock of claim_dir() without the wipe, for a directory whose content outlives a
    run (`fleet run`: each device's flash, boot counter and outbox). Made if absent."""
    path = private_dir(path)
    with _locked(path, owner, flag):
        yield path


@contextlib.contextmanager
def claim_dir(
    path: pathlib.Path, owner: str, flag: str = "--run-dir", known: frozenset[str] = frozenset()
) -> Iterator[pathlib.Path]:
    """fresh_dir() under an exclusive lock held until the block ends. A directory
    another process holds raises DirInUse (naming its pid) before anything in it
    is touched; a folder that is not ours raises DirNotOurs before a lock file is
    written into it."""
    path = pathlib.Path(path)
    _check(path, flag, known)
    private_dir(path, tighten=True)
    with _locked(path, owner, flag):
        _check(path, flag, known)  # what the directory holds now that nobody else writes to it
        _wipe(path, keep=LOCK_FILE)
        _mark(path, owner)
        yield path
