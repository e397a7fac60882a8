"""argparse value types shared by the subcommands. Each raises ArgumentTypeError
with a sentence, so argparse prints `argument --x: <sentence>` (never the name
of a Python function)."""

from __future__ import annotations

import argparse
import json
import math
import pathlib


def _number(text: str, kind, what: str):
    try:
        v = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if isinstance(v, float) and not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return v


def positive_int(text: str) -> int:
    """A whole number >= 1 (counts, sizes)."""
    n = _number(text, int, "a whole number >= 1")
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (a whole number), got {n}")
    return n


def non_negative_int(text: str) -> int:
    """A whole number >= 0 (0 switches the thing off)."""
    n = _number(text, int, "a whole number >= 0")
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (a whole number), got {n}")
    return n


def positive_float(text: str) -> float:
    """A number > 0 (durations that must pass, rates)."""
    v = _number(text, float, "a number > 0")
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def non_negative_float(text: str) -> float:
    """A number >= 0 (0 switches the thing off)."""
    v = _number(text, float, "a number >= 0")
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def port_number(text: str) -> int:
    """A TCP port, 1..65535."""
    n = _number(text, int, "a TCP port 1..65535")
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port 1..65535, got {n}")
    return n


def host_port(text: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 as [::1]:PORT) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT with a port 1..65535 (e.g. 127.0.0.1:8883), got {text!r}")
    return host.strip("[]"), int(port)


def read_json_object(path: str, what: str) -> dict:
    """The JSON object in file `path`; ValueError with a sentence naming `what` when it is not one."""
    try:
        obj = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"cannot read {what} {path}: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{what} {path} is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{what} {path} must hold a JSON object, got {type(obj).__name__}")
    return obj


HEAP_FLOOR = 64 * 1024  # the firmware's measured floor (docs/application.md, Memory)


def heap_size(text: str) -> str | None:
    """A MicroPython heap size for `-X heapsize=`: N, NK or NM (bytes, KiB, MiB), at least
    64K (the application's measured floor); 'none' -> None (the port's own default)."""
    t = text.strip()
    if t.lower() == "none":
        return None
    unit = {"k": 1024, "m": 1024 * 1024}.get(t[-1:].lower(), 1)
    digits = t[:-1] if unit > 1 else t
    if not digits.isdigit():
        raise argparse.ArgumentTypeError(
            f"expected a size like 96K or 1M (bytes, K = KiB, M = MiB) or 'none', got {text!r}"
        )
    if int(digits) * unit < HEAP_FLOOR:
        raise argparse.ArgumentTypeError(
            f"must be at least 64K (the firmware's measured floor, docs/application.md), got {text}"
        )
    return digits + t[-1].upper() if unit > 1 else digits


def existing_file(text: str) -> str:
    """A path to a readable regular file (a password file, a certificate), checked before any work."""
    p = pathlib.Path(text)
    if not p.exists():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    if not p.is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a file")
    try:
        with open(p, "rb"):
            pass
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {e.strerror or e}") from None
    return text


def directory(text: str) -> str:
    """A directory that exists or can be made: refused when the path (or a parent) is a file."""
    p = pathlib.Path(text)
    for q in (p, *p.parents):
        if q.exists() or q.is_symlink():
            if not q.is_dir():
                what = "is" if q == p else f"is under {q}, which is"
                raise argparse.ArgumentTypeError(f"{text} {what} not a directory")
            break
    return text
