"""`bench fleet --cut-after` (issue 24): simulated devices that lose their connection after
some PUBLISHes must really land copies (the resends a fleet's landing zone holds after any
reconnect), and the fleet bench must fail a run whose records/ keeps one. A real Mosquitto
(TLS, one account per device) and the real recorder; no Spark (the streaming job's
de-duplication is tested in tests/spark; the whole chain by the fleet smoke test)."""

from __future__ import annotations

import asyncio
import time

import pytest

from mqbatch.bench import simfleet
from mqbatch.ingest import e2eack
from mqbatch_testing.bench import landed_batches


def _fig(**changes) -> dict:
    fig = {"lost": 0, "lost_devices": {}, "extra_rows": 0, "duplicate_rows": 0}
    fig["device_totals"] = {"dropped": 0, "outbox": 0}
    for key, value in changes.items():
        (fig["device_totals"] if key in ("dropped", "outbox") else fig)[key] = value
    return fig


@pytest.mark.fast
def test_a_fleet_run_fails_on_a_record_in_records_twice():
    from mqbatch.bench.fleet import problems

    assert problems(_fig()) == []
    assert problems(_fig(duplicate_rows=3)) == ["3 records in records/ more than once"]
    assert len(problems(_fig(lost=1, lost_devices={"sim-1": 1}, extra_rows=2, dropped=4, outbox=5))) == 4


async def _run(devices, opts, seconds: float, drain_s: float = 60.0) -> dict:
    state = {"t0": time.monotonic(), "stats": {}}

    def control():
        elapsed = time.monotonic() - state["t0"]
        if elapsed < seconds:
            return None
        drained = state["stats"].get("outbox", 1) == 0
        return "end" if drained or elapsed > seconds + drain_s else "flush"

    def report(stats):
        state["stats"] = stats

    return await simfleet.run_devices(devices, opts, control, report)


@pytest.mark.broker
def test_cut_connections_land_copies_and_every_record_once_at_least(tmp_path):
    from mqbatch.bench.fleet import stack_recorder
    from mqbatch.lab.stack import LocalStack

    names = [f"sim-{i}" for i in range(4)]
    stack = LocalStack(tmp_path / "stack", names)
    stack.broker.start()
    rec = stack_recorder(stack, tmp_path)
    try:
        rec.start()
        # cut within 50 ms of a PUBLISH: mostly after the recorder took it, before its ack came back
        opts = simfleet.SimOptions(
            host=stack.broker.host,
            port=stack.broker.port,
            cafile=str(stack.ca_cert),
            rate=40,
            batch=5,
            ramp_s=0.2,
            cut_after=0.5,
            cut_within_s=0.05,
        )
        devices = [(d, stack.credentials[d], stack.hmac_keys[d]) for d in names]
        result = asyncio.run(_run(devices, opts, seconds=6.0))
        assert rec.stop() == 0, rec.output()  # its open segment becomes a landing file
    finally:
        rec.close()
        stack.broker.stop()
    st = result["stats"]
    # (a cut that fires during the run's own end is counted as a cut, not as a lost connection)
    assert st["cuts"] > 0 and st["disconnects"] > 0 and st["connects"] > len(names), st
    assert st["republished"] > 0 and st["outbox"] == 0 and st["acked"] == st["stored"], st
    landed = landed_batches(tmp_path / "landing")
    copies = sum(n - 1 for n in landed.values())
    assert copies > 0, f"{st['cuts']} cuts landed no PUBLISH twice: {st}"
    # every batch a device stored is in the landing zone (at least once)
    for dev, samples in result["samples"].items():
        seqs = set()
        for (topic, value), _n in landed.items():
            if topic == f"mqbatch/{dev}/telemetry":
                _boot, first, last = e2eack.parse_batch_seq(value)
                seqs.update(range(first, last + 1))
        assert seqs == set(range(len(samples))), dev
