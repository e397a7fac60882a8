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
