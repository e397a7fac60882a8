"""Will this config fit the board's heap? `mqbatch deploy` asks the board before it copies
anything (docs/application.md, "Heap check before a deploy").

    reading = parse_reading(board_output)        # what BOARD_SCRIPT printed on the board
    est = estimate(merged_config, reading, install)
    est.fits, est.need, est.available, est.terms

The need is a sum of measured terms (`tools/heap_app.py`, 2026-11-26: the application
after start-up, `gc.mem_alloc()` after `gc.collect()`, minus an empty interpreter's),
scaled to the config: the firmware (by word size and by where its bytecode lives), the two
batch buffers, the outbox's RAM index, batch-hmac, e2e acks, TLS where mbedTLS allocates
from the GC heap, and a margin. What the board has is read per port: `gc.mem_free()`
after `gc.collect()`, and on the esp32 port also the ESP-IDF heap the GC heap grows into
(MicroPython >= 1.21), less what TLS needs there.
"""

from __future__ import annotations

import dataclasses
import json

# Runs on the board (mpremote exec, after its soft reset: the application is not running).
# Prints HEAPINFO {...}: sys.platform, sys.maxsize (the word size), gc.mem_free()/mem_alloc()
# after gc.collect(), the ESP-IDF data heap's free bytes where the port has esp32.idf_heap_info,
# and where `import mqb_app` would load from (a file on the filesystem, or none: frozen).
BOARD_SCRIPT = """
import gc, sys, os, json
gc.collect()
r = {'platform': sys.platform, 'maxsize': sys.maxsize, 'free': gc.mem_free(), 'alloc': gc.mem_alloc()}
try:
    import esp32
    h = esp32.idf_heap_info(esp32.HEAP_DATA)
    r['idf_free'] = sum(x[1] for x in h)
    r['idf_largest'] = max([x[2] for x in h] or [0])
except (ImportError, AttributeError):
    pass
r['app'] = None
for p in sys.path:
    for e in ('.mpy', '.py'):
        n = (p or '.') + '/mqb_app' + e
        try:
            os.stat(n)
        except OSError:
            continue
        r['app'] = r['app'] or n
print('HEAPINFO' + json.dumps(r))
"""

# The firmware after start-up with the measured config (flush.max_bytes 2048, outbox 8
# segments x 16 entries, TLS configured, no hmac_key, no e2e_ack): gc.mem_alloc() after
# gc.collect() minus an empty interpreter's (64-bit Unix port 992 B, 32-bit WebAssembly
# port 4,704 B). tools/heap_app.py prints the totals (--files: .mpy files; --port wasm32).
MEASURED_MAX_BYTES = 2048
MEASURED_INDEX_SLOTS = 8 * 16
FIRMWARE = {
    # (word bits, where the bytecode is): (bytes, what)
    (64, "files"): (105_024 - 992, "measured, 64-bit Unix port, .mpy files"),
    (64, "frozen"): (60_224 - 992, "measured, 64-bit Unix port, .mpy in ROMFS"),
    (32, "files"): (80_880 - 4_704, "measured, 32-bit WebAssembly port, .mpy files"),
    # the .mpy figure less the bytecode and constants files put in the heap on 32-bit
    # (tools/mpy_sizes.py: 43,664 B in 16-byte GC blocks; docs/application.md)
    (32, "frozen"): (80_880 - 4_704 - 43_664, "estimated from the 32-bit .mpy figure"),
}
# Feature costs over that config, the same harness (32-bit frozen: the .mpy figures, an upper bound).
HMAC = {(64, "files"): 2_272, (64, "frozen"): 1_568, (32, "files"): 1_632, (32, "frozen"): 1_632}
E2E = {(64, "files"): 11_936, (64, "frozen"): 5_856, (32, "files"): 13_248, (32, "frozen"): 13_248}
BUFFER_ROOM = 160  # main.py: two buffers of flush.max_bytes + 160 (measured: +4,096 B for +2,048 B of max_bytes)
INDEX_SLOT = 7  # outbox RAM index per entry slot (measured: +896 B for 128 more slots, 64-bit)
# e2e flow control (issue 22): a table of the entries sent and not yet e2e-acked, one slot per
# outbox index slot: 4 + 12 + 4 + 1 B (mqb_e2e's arrays); E2E above was measured before it
# (after it, 64-bit ROMFS: +3,712 B for 128 slots, of which this table is 2,688)
E2E_SLOT = 21
# mbedTLS on the GC heap (rp2, bare-metal ports): a 16 KB input and a 4 KB output record buffer
# per connection (MBEDTLS_SSL_IN/OUT_CONTENT_LEN in MicroPython's mbedtls config); a lower bound
TLS_ON_GC_HEAP = 20_480
# On esp32 mbedTLS allocates from the ESP-IDF heap that the GC heap grows into: keep this much of it
ESP32_IDF_FOR_TLS = 45_056
# a step's transient allocations and fragmentation (peak_heap runs 0.5-2 KB over peak_heap_live
# in the 64-bit soak; the 64 KB start-up needs free runs of ~600 B)
MARGIN = 4_096
GC_HEAP_TLS_PLATFORMS = ("rp2",)  # where mbedTLS allocates from the GC heap (unix: the C library's malloc)


class HeapInfoError(ValueError):
    pass


def parse_reading(output: str) -> dict:
    """The HEAPINFO line BOARD_SCRIPT printed."""
    for line in output.splitlines():
        if line.startswith("HEAPINFO"):
            try:
                r = json.loads(line[len("HEAPINFO") :])
            except json.JSONDecodeError:
                break
            if isinstance(r, dict) and isinstance(r.get("free"), int) and isinstance(r.get("maxsize"), int):
                return r
            break
    raise HeapInfoError(f"the board did not report its heap; it printed: {output[-300:]!r}")


def install_kind(reading: dict, copying_files: bool) -> str:
    """'files' (.mpy or .py files on the board's filesystem: bytecode in the heap) or 'frozen'
    (frozen into the image, or in ROMFS: bytecode in flash)."""
    if copying_files:
        return "files"
    where = reading.get("app")
    if not where or str(where).startswith("/rom"):
        return "frozen"
    return "files"


@dataclasses.dataclass
class Estimate:
    need: int
    available: int
    terms: list[tuple[str, int]]
    basis: str  # how `available` was read
    notes: list[str]

    @property
    def fits(self) -> bool:
        return self.need <= self.available

    @property
    def largest(self) -> tuple[str, int]:
        return max(self.terms, key=lambda t: t[1])


def estimate(config: dict, reading: dict, install: str) -> Estimate:
    """What `config` (merged over the firmware's defaults: mqb_config.make_config's result)
    needs on the board that gave `reading`, and what that board has."""
    bits = 64 if reading["maxsize"] > 2**31 else 32
    platform = str(reading.get("platform"))
    key = (bits, install)
    fw, what = FIRMWARE[key]
    flush, outbox, broker = config["flush"], config["outbox"], config["broker"]
    slots = int(outbox["segments"]) * int(outbox["max_entries"])
    terms = [
        (
            f"firmware ({what})",
            fw - 2 * (MEASURED_MAX_BYTES + BUFFER_ROOM) - INDEX_SLOT * MEASURED_INDEX_SLOTS,
        ),
        (f"batch buffers 2 x ({int(flush['max_bytes'])} + {BUFFER_ROOM})", 2 * (int(flush["max_bytes"]) + BUFFER_ROOM)),
        (f"outbox index {slots} slots x {INDEX_SLOT}", INDEX_SLOT * slots),
    ]
    if config.get("hmac_key"):
        terms.append(("batch-hmac", HMAC[key]))
    if config.get("e2e_ack"):  # present after make_config only when enabled
        terms.append(("e2e acks", E2E[key]))
        terms.append((f"e2e unconfirmed table {slots} slots x {E2E_SLOT}", E2E_SLOT * slots))
    notes = []
    if broker.get("tls") and platform in GC_HEAP_TLS_PLATFORMS:
        terms.append(("TLS on the GC heap (mbedTLS record buffers, at least)", TLS_ON_GC_HEAP))
    terms.append(("margin (transients, fragmentation)", MARGIN))
    if str(reading.get("app") or "").endswith(".py"):
        notes.append("the modules are .py sources: compiling them on the board needs more than this")
    free = int(reading["free"])
    available, basis = free, f"{free:,} B free in the GC heap"
    if "idf_free" in reading:  # esp32: the GC heap grows into the IDF heap, which TLS also needs
        keep = ESP32_IDF_FOR_TLS if broker.get("tls") else 0
        grow = max(0, int(reading["idf_free"]) - keep)
        available = free + grow
        basis = (
            f"{free:,} B free in the GC heap + {grow:,} B it can grow into "
            f"(IDF heap {int(reading['idf_free']):,} B free, {keep:,} B kept for TLS)"
        )
    return Estimate(sum(n for _, n in terms), available, terms, f"{basis}; {platform}, {bits}-bit", notes)


def describe(est: Estimate) -> str:
    name, size = est.largest
    return (
        f"this config needs about {est.need:,} B of heap and the board has {est.available:,} B "
        f"({est.basis}); largest term: {name} {size:,} B"
    )
