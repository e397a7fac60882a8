"""`mqbatch bench e2e-cost`: what end-to-end acks cost on the wire, measured.

One simulated device (mqbatch.bench.simfleet: batch-format v1, 38-byte binary records,
batch-hmac, QoS 1, CPython's TLS) publishes batches stop-and-wait through the project's
inspecting proxy (mqbatch.conformance.proxy: TLS record bytes per direction and TCP
segments, no keys needed) to Mosquitto, with the recorder (`mqbatch ingest`) landing them.
Twice per batch size, the same records: with e2e acks (the batch-seq property, the
recorder's ack PUBLISH on mqbatch/<id>/ack and the device's PUBACK of it; the batch leaves
the outbox on the ack) and without (`--no-e2e-ack`, no batch-seq; the batch leaves on the
broker's PUBACK). Bytes per batch = the proxy's counter difference over --batches batches
after a warm-up, both directions; TCP/IP = segments x 52 B as in `bench wire`. The cost of
e2e acks is the difference, per batch and per record.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import ssl
import tempfile
import time

from mqbatch.bench import simfleet

TCPIP = 52  # IPv4 20 + TCP 20 + timestamps 12, as in mqbatch.bench.wire


async def _drive(dev: simfleet.Device, batches: int, size: int, snapshot) -> dict:
    stop = asyncio.Event()
    task = asyncio.ensure_future(dev.run_connection(stop))
    await asyncio.wait_for(dev.connected.wait(), 30)

    async def one() -> None:
        for _ in range(size):
            dev.sample(int(time.time() * 1000))
        deadline = time.monotonic() + 30
        while dev.outbox:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{dev.dev}: no {'e2e ack' if dev.o.e2e else 'PUBACK'} within 30 s")
            await asyncio.sleep(0.001)

    await one()  # warm-up: the subscription and the first ack are not counted
    await asyncio.sleep(0.5)
    before = snapshot()
    for _ in range(batches):
        await one()
    await asyncio.sleep(0.5)  # delayed ACKs have gone out
    after = snapshot()
    stop.set()
    await dev.disconnect()
    task.cancel()
    return {"before": before, "after": after}


def measure(size: int, batches: int, e2e: bool, tmp: pathlib.Path) -> dict:
    from mqbatch.bench.fleet import stack_recorder
    from mqbatch.conformance.proxy import Proxy
    from mqbatch.conformance.session import C2S, S2C
    from mqbatch.lab.stack import LocalStack

    stack = LocalStack(tmp / "stack", ["dev-001"])
    stack.broker.start()
    rec = stack_recorder(stack, tmp, () if e2e else ("--no-e2e-ack",))
    try:
        rec.start()
        with Proxy(stack.broker.host, stack.broker.port) as px:
            opts = simfleet.SimOptions(host=px.host, port=px.port, cafile=str(stack.ca_cert), batch=size, e2e=e2e)
            stats = {k: 0 for k in simfleet.COUNTERS}
            ctx = ssl.create_default_context(cafile=str(stack.ca_cert))
            dev = simfleet.Device("dev-001", stack.credentials["dev-001"], stack.hmac_keys["dev-001"], opts, ctx, stats)
            got = asyncio.run(_drive(dev, batches, size, px.counters))
    finally:
        rec.close()
        stack.broker.stop()
    b, a = got["before"], got["after"]
    out = {}
    for d in (C2S, S2C):
        tls = (a["tls_bytes"][d] - b["tls_bytes"][d]) / batches
        segs = (a["segments"][d] - b["segments"][d]) / batches
        out[d] = {"tls_bytes": tls, "segments": segs, "wire_bytes": tls + TCPIP * segs}
    out["total_wire_bytes"] = out[C2S]["wire_bytes"] + out[S2C]["wire_bytes"]
    return out


def bench_e2e_cost(args: argparse.Namespace) -> int:
    from mqbatch.bench.out import write_result

    rows = []
    print(
        f"e2e-cost: one simulated device, stop-and-wait, {args.batches} batches per measurement, "
        "TLS (CPython/OpenSSL) through the inspecting proxy to Mosquitto, recorder landing"
    )
    for size in args.sizes:
        res = {}
        for e2e in (False, True):
            with tempfile.TemporaryDirectory(prefix="mqbatch-bench-e2e-") as t:
                res[e2e] = measure(size, args.batches, e2e, pathlib.Path(t))
        per_batch = res[True]["total_wire_bytes"] - res[False]["total_wire_bytes"]
        row = {
            "batch": size,
            "without": res[False],
            "with": res[True],
            "extra_bytes_per_batch": per_batch,
            "extra_bytes_per_record": per_batch / size,
            "extra_tls_bytes_per_batch": sum(
                res[True][d]["tls_bytes"] - res[False][d]["tls_bytes"] for d in ("c2s", "s2c")
            ),
        }
        rows.append(row)
        print(
            f"  batch {size:3}: without e2e acks {res[False]['total_wire_bytes']:,.1f} B/batch on the wire "
            f"(TLS+TCP/IP, both directions), with {res[True]['total_wire_bytes']:,.1f}: e2e acks add "
            f"{per_batch:,.1f} B/batch = {per_batch / size:.2f} B/record (TLS bytes alone: "
            f"{row['extra_tls_bytes_per_batch']:,.1f} B/batch)"
        )
    write_result(args, "e2e-cost", {"batches": args.batches, "rows": rows})
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", type=int, nargs="+", default=[20, 91], help="records per batch (default 20 91)")
    p.add_argument("--batches", type=int, default=50, help="batches per measurement (default 50)")
