"""µs per outbox append and per checked read in the MicroPython Unix port (64-bit), by CRC path.

    .venv/bin/python tools/bench_outbox_crc.py [--before DIR] [--runs 5] [--n 200] [--size 2000]

Timed: `Outbox.append(payload, 10)` of a `size`-byte payload (flushed to a file on the
host, VfsPosix) and `Outbox.read(eid, dest)` of it with its CRC checked, n of each per
run, µs per call. Paths: "native" (mqb_native's machine code, what every port with
a native emitter runs: ESP32, RP2040, this Unix port), "tables" (mqb_outbox_format._C =
None: the CRC-32 in 16-bit halves in Python, what a port without one runs, e.g. the
WebAssembly port). --before DIR times a checkout's firmware as it is (e.g. one made with
`git worktree add /tmp/before <rev>`), the baseline the ratios are against.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]

from mqbatch.util.paths import micropython_exe  # noqa: E402

SCRIPT = """
import time, json
from mqb_outbox import Outbox
PATH = %r
if PATH == "tables":
    import mqb_outbox_format as F
    F._C = None
n, size = %d, %d
ob = Outbox(%r, segment_size=65536, max_segments=8, max_entries=64)
data = memoryview(bytearray(bytes(range(256)) * (size // 256 + 1))[:size])
dest = bytearray(size)
t0 = time.ticks_us()
for i in range(n):
    ob.append(data, 10)
t1 = time.ticks_us()
first = ob._next_id - ob.depth
for i in range(ob.depth):
    assert ob.read(first + i, dest) == size
t2 = time.ticks_us()
k = ob.depth
ob.close()
print("BENCH", json.dumps({"append_us": time.ticks_diff(t1, t0) / n, "read_us": time.ticks_diff(t2, t1) / k}))
"""


def run(firmware: pathlib.Path, path: str | None, n: int, size: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="mqb-crc-") as tmp:
        proc = subprocess.run(
            [str(micropython_exe()), "-c", SCRIPT % (path, n, size, tmp + "/ob")],
            env={**os.environ, "MICROPYPATH": str(firmware)},
            capture_output=True,
            text=True,
            timeout=300,
        )
    line = [x for x in proc.stdout.splitlines() if x.startswith("BENCH ")]
    if proc.returncode or not line:
        raise SystemExit(f"{firmware} ({path}): {proc.stdout[-1500:]} {proc.stderr[-1500:]}")
    return json.loads(line[0][6:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=pathlib.Path, help="a checkout whose firmware/ is the baseline")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--size", type=int, default=2000)
    args = ap.parse_args(argv)
    rows = ([("before", args.before / "firmware", None)] if args.before else []) + [
        ("native", ROOT / "firmware", "native"),
        ("tables", ROOT / "firmware", "tables"),
    ]
    figures = {name: [run(fw, path, args.n, args.size) for _ in range(args.runs)] for name, fw, path in rows}
    base = rows[0][0]
    print(
        f"Outbox of {args.size}-byte payloads, {args.n} appends then {args.n} checked reads per run, {args.runs} runs,"
    )
    print(f"MicroPython Unix port {sys.platform} 64-bit; µs per call, median [min-max], ratio to {base}'s median")
    for key in ("append_us", "read_us"):
        ref = statistics.median(r[key] for r in figures[base])
        for name, _, _ in rows:
            v = [r[key] for r in figures[name]]
            med = statistics.median(v)
            print(f"  {key[:-3]:7} {name:7} {med:9.1f} [{min(v):.1f}-{max(v):.1f}]  x{med / ref:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
