"""Run and build directories mqbatch may wipe: only ones it made itself.

    fresh_dir(path, "mqbatch demo")   # empty path for a new run, or DirNotOurs

A directory is wiped only when it is empty or holds the marker file that
fresh_dir() writes into every directory it makes; a user's folder (anything
else) is refused with an error that names it. One helper for every command
that removes a folder (demo; deploy can switch to it)."""

from __future__ import annotations

import pathlib
import shutil

MARKER = ".mqbatch-run"
LEGACY_MARKERS = (".mqbatch-build",)  # what `mqbatch deploy` wrote into its build directories


class DirNotOurs(RuntimeError):
    """The directory holds files mqbatch did not create: it is not wiped."""


def is_ours(path: pathlib.Path) -> bool:
    return any((path / m).is_file() for m in (MARKER, *LEGACY_MARKERS))


def fresh_dir(
    path: pathlib.Path, owner: str, flag: str = "--run-dir", known: frozenset[str] = frozenset()
) -> pathlib.Path:
    """Make `path` an empty directory marked as made by `owner` (e.g. "mqbatch demo").
    An existing directory is wiped only if it is empty, marked, or holds nothing but
    entries named in `known` (what `owner` writes: a run of a version before the
    marker); otherwise DirNotOurs (the message names the folder and the `flag`)."""
    path = pathlib.Path(path)
    if path.exists() or path.is_symlink():
        if not path.is_dir() or path.is_symlink():
            raise DirNotOurs(
                f"{path} exists and is not a plain directory (a file or a symlink): nothing was deleted; "
                f"choose another {flag}"
            )
        names = {p.name for p in path.iterdir()}
        if names and not is_ours(path) and not (known and names <= known):
            raise DirNotOurs(
                f"{path} is not empty and was not made by mqbatch (no {MARKER} file): "
                f"nothing was deleted; choose another {flag} or empty it yourself"
            )
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / MARKER).write_text(f"made by {owner}; wiped at its next run\n")
    return path
