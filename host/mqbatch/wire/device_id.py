"""The one device-id rule, shared by fleet provisioning and the Spark job (issue 23.5).

A device id is at once its broker username, its client id, the second level of its
topics (mqbatch/<id>/telemetry) and a directory name (fleet DIR/devices/<id>/).
So it is 1..64 characters of ``a-z 0-9 _ . -``, starting with a letter or digit:

- no upper case: Mosquitto compares usernames and client ids byte by byte, while
  a case-insensitive filesystem (macOS, Windows) would give ``Dev-1`` and
  ``dev-1`` one directory; one spelling per device;
- not starting with ``.``, ``_`` or ``-``: no ``.`` or ``..`` (a path), no hidden
  name, nothing an option parser takes for a flag;
- no ``/ + # $``, spaces, control, format or right-to-left characters (topic
  syntax, and what a reader cannot see).

    is_device_id("dev-001")          # True
    device_id_problem("..")          # "'..' must start with a letter or digit ..."
    check_device_id("Dev-1")         # ValueError with that reason
"""

from __future__ import annotations

import re

MAX_DEVICE_ID = 64
DEVICE_ID_PATTERN = r"[a-z0-9][a-z0-9_.-]{0,63}"  # also usable inside a bigger regex (vectorised checks)
DEVICE_ID_RE = re.compile(DEVICE_ID_PATTERN)
RULE = f"1..{MAX_DEVICE_ID} characters of a-z 0-9 _ . -, starting with a letter or digit"


def device_id_problem(device_id: object) -> str | None:
    """Why `device_id` is not a device id (one line), or None if it is one."""
    if not isinstance(device_id, str):
        return f"device id {device_id!r} is not a string"
    if DEVICE_ID_RE.fullmatch(device_id):
        return None
    shown = ascii(device_id[:40]) + ("..." if len(device_id) > 40 else "")
    if not device_id:
        why = "is empty"
    elif len(device_id) > MAX_DEVICE_ID:
        why = f"has {len(device_id)} characters (at most {MAX_DEVICE_ID})"
    elif device_id != device_id.lower() and is_device_id(device_id.lower()):
        why = f"has upper case (ids are lower case: {device_id.lower()!r})"
    elif not re.match(r"[a-z0-9]", device_id):
        why = f"starts with {ascii(device_id[0])} (must start with a letter or digit)"
    else:
        bad = sorted({c for c in device_id if not re.fullmatch(r"[a-z0-9_.-]", c)})[:5]
        why = f"has {ascii(''.join(bad))}"
    return f"device id {shown} {why}: a device id is {RULE}"


def is_device_id(device_id: object) -> bool:
    return isinstance(device_id, str) and DEVICE_ID_RE.fullmatch(device_id) is not None


def check_device_id(device_id: object) -> str:
    """`device_id` if it is a device id, else ValueError with device_id_problem's reason."""
    problem = device_id_problem(device_id)
    if problem is not None:
        raise ValueError(problem)
    assert isinstance(device_id, str)
    return device_id
