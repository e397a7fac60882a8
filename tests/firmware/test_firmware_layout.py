"""The firmware's files: one job each, in strict layers (issue 20 item 3).

Every device module (firmware/*.py, the boards' mqb_*.py) is parsed, never run:
- no file is over MAX_LINES lines;
- every mqb_* module has a layer below, and imports (at the top or inside a
  function) only modules of its own layer or of a lower one; a module this
  table does not know, file or import, fails until it is given a layer;
- a private const() the App's or the outbox's modules copy from one another
  (const names are folded into each module's bytecode, so each keeps a copy)
  has the same value in every copy.
The last test feeds the checks broken sources to show that each one fails.
"""

from __future__ import annotations

import ast

from mqbatch.util.paths import BOARDS, FIRMWARE

MAX_LINES = 400

# Lowest first. A module may import modules of its own layer or of a lower one.
LAYERS = [
    ("pure codec", {"mqb_native", "mqb_codec", "mqb_record", "mqb_hmac"}),
    ("MQTT packets", {"mqb_packet", "mqb_packet_build", "mqb_packet_e2e"}),
    ("transport", {"mqb_transport"}),  # sockets, TLS: the client drives one
    ("client/session", {"mqb_inflight", "mqb_client", "mqb_sub"}),
    ("on-flash format", {"mqb_boot", "mqb_outbox_format"}),
    ("outbox recovery", {"mqb_outbox_recover"}),
    ("outbox queue", {"mqb_outbox"}),
    ("board", {"mqb_board", "mqb_wifi"}),
    ("e2e acks", {"mqb_e2e"}),
    ("application: configuration", {"mqb_config"}),
    ("application: sampling and flush", {"mqb_flush"}),
    ("application: network session", {"mqb_net"}),
    ("application", {"mqb_app", "main"}),
]
RANK = {m: i for i, (_, mods) in enumerate(LAYERS) for m in mods}

# modules that keep copies of one another's private constants
CONST_FAMILIES = [
    {"mqb_app", "mqb_flush", "mqb_net", "mqb_e2e"},
    {"mqb_outbox", "mqb_outbox_recover", "mqb_outbox_format"},
    {"mqb_packet", "mqb_packet_build"},
    {"mqb_client", "mqb_inflight"},
]


def device_sources() -> dict[str, str]:
    files = sorted(FIRMWARE.glob("*.py")) + sorted(BOARDS.glob("*/mqb_*.py"))
    out: dict[str, str] = {}
    for f in files:
        out.setdefault(f.stem, f.read_text(encoding="utf-8"))  # one mqb_board is enough: same imports
    return out


def imports_of(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return {n for n in names if n.startswith("mqb_")}


def layer_violations(sources: dict[str, str]) -> list[str]:
    bad = []
    for mod, src in sources.items():
        if mod != "main" and not mod.startswith("mqb_"):
            bad.append(f"{mod}: device module names start with mqb_ (host code never shares an import name)")
        if mod not in RANK:
            bad.append(f"{mod}: no layer (add it to LAYERS in tests/firmware/test_firmware_layout.py)")
            continue
        for imp in sorted(imports_of(src)):
            if imp not in RANK:
                bad.append(f"{mod} imports {imp}, which has no layer")
            elif RANK[imp] > RANK[mod]:
                bad.append(f"{mod} ({LAYERS[RANK[mod]][0]}) imports {imp} of a higher layer ({LAYERS[RANK[imp]][0]})")
    return bad


def long_files(sources: dict[str, str], limit: int = MAX_LINES) -> list[str]:
    out = []
    for m, s in sources.items():
        n = len(s.splitlines())
        if n > limit:
            out.append(f"{m}: {n} lines > {limit}")
    return out


def private_consts(source: str) -> dict[str, object]:
    """name -> value of each module-level NAME = const(value); a private copy _X of
    another module's public X = const(value) is compared with it (key X)."""
    out = {}
    for node in ast.parse(source).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", None) == "const"
        ):
            out[node.targets[0].id.lstrip("_")] = ast.literal_eval(node.value.args[0])
    return out


def const_mismatches(sources: dict[str, str]) -> list[str]:
    bad = []
    for family in CONST_FAMILIES:
        seen: dict[str, tuple[str, object]] = {}
        for mod in sorted(family & sources.keys()):
            for name, value in private_consts(sources[mod]).items():
                if name in seen and seen[name][1] != value:
                    bad.append(f"{name}: {value!r} in {mod}, {seen[name][1]!r} in {seen[name][0]}")
                seen.setdefault(name, (mod, value))
    return bad


def test_no_firmware_file_is_over_400_lines():
    assert long_files(device_sources()) == []


def test_imports_go_down_the_layers_only():
    assert layer_violations(device_sources()) == []


def test_copied_constants_agree():
    assert const_mismatches(device_sources()) == []


def test_the_checks_fail_on_broken_sources():
    good = device_sources()
    # an upward import: the codec importing the application
    broken = dict(good, mqb_codec=good["mqb_codec"] + "\nimport mqb_app\n")
    assert layer_violations(broken) == ["mqb_codec (pure codec) imports mqb_app of a higher layer (application)"]
    # inside a function too: the outbox queue reaching for the network session
    broken = dict(good, mqb_outbox=good["mqb_outbox"] + "\ndef f():\n    from mqb_net import Session\n")
    assert layer_violations(broken) == [
        "mqb_outbox (outbox queue) imports mqb_net of a higher layer (application: network session)"
    ]
    # a new module nobody placed, and an import of one
    assert layer_violations(dict(good, mqb_new="x = 1\n")) == [
        "mqb_new: no layer (add it to LAYERS in tests/firmware/test_firmware_layout.py)"
    ]
    assert layer_violations(dict(good, mqb_app=good["mqb_app"] + "\nimport mqb_new\n")) == [
        "mqb_app imports mqb_new, which has no layer"
    ]
    assert layer_violations(dict(good, util="x = 1\n"))[0].startswith("util: device module names start with mqb_")
    # a file one line too long
    assert long_files({"mqb_x": "x = 1\n" * 401}) == ["mqb_x: 401 lines > 400"]
    assert long_files({"mqb_x": "x = 1\n" * 400}) == []
    # a copied count index that drifted
    broken = dict(good, mqb_net=good["mqb_net"].replace("_PUBLISHES = const(11)", "_PUBLISHES = const(12)"))
    assert broken["mqb_net"] != good["mqb_net"]
    assert const_mismatches(broken) == ["PUBLISHES: 12 in mqb_net, 11 in mqb_app"]
    # a private copy of another module's public constant that drifted
    broken = dict(good, mqb_inflight=good["mqb_inflight"].replace("_BUSY = const(-1)", "_BUSY = const(-4)"))
    assert broken["mqb_inflight"] != good["mqb_inflight"]
    assert const_mismatches(broken) == ["BUSY: -4 in mqb_inflight, -1 in mqb_client"]
