"""The device outbox survives SIGKILL at random moments (firmware/mqb_outbox.py).

A MicroPython process (tests/mpy/outbox_crash_worker.py) appends to and acks
from an outbox in a tmp dir on the real filesystem (VfsPosix, flush = fsync),
printing a line after each append() and ack() returns. This test kills it with
SIGKILL at a random moment, starts it again on the same directory, and checks
what the reopened outbox holds against everything the killed runs reported:

- every entry whose append() returned and whose ack() did not is there, byte
  for byte (length, CRC-32, record count);
- no entry whose ack() returned comes back;
- the only entry nobody reported is the append() in flight at the kill, and it
  is complete and intact (the worker reads every entry back, CRC-checked);
- the only reported entry that may be missing is the ack() in flight.

The second test runs the compiled firmware with an outbox whose oldest segment
rotted (issue 10 finding 7): the device boots, delivers the rest and counts
the loss.
"""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import time
import zlib

from mqbatch_testing import MICROPYTHON, MPY_TESTS, mpy_env

WORKER = MPY_TESTS / "outbox_crash_worker.py"
RUNS = 24


def _load_outbox_util():
    """tests/mpy/outbox_util.py, loaded by path: the worker's payload() itself."""
    spec = importlib.util.spec_from_file_location("mpy_outbox_util", MPY_TESTS / "outbox_util.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


payload = _load_outbox_util().payload


def payload_len(run: int, i: int) -> int:
    return 1 + (run * 131 + i * 37) % 400


def start(root, run, log_path):
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [str(MICROPYTHON), str(WORKER), str(root), str(run)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=mpy_env(),
        cwd=MPY_TESTS,
    )
    log.close()
    return proc


def lines(log_path) -> list[list[str]]:
    """The complete lines the worker wrote (a line is one write: whole or absent)."""
    data = log_path.read_bytes().decode()
    complete = data[: data.rfind("\n") + 1]
    return [ln.split() for ln in complete.splitlines()]


def wait_ready(proc, log_path, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(ln and ln[0] == "READY" for ln in lines(log_path)):
            return
        if proc.poll() is not None:
            raise AssertionError(f"worker exited {proc.returncode}:\n{log_path.read_text()}")
        time.sleep(0.01)
    proc.kill()
    raise AssertionError("worker never became ready:\n" + log_path.read_text())


def test_outbox_survives_sigkill_at_random_moments(tmp_path):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    print(f"random seed {seed}")
    root = tmp_path / "outbox"
    model: dict[int, tuple[int, str, int]] = {}  # id -> (len, crc hex, records): must be there
    acked: set[tuple[int, str]] = set()  # (id, crc) whose ack() returned
    in_flight_append = None  # (len, crc, records) of the append() at the kill
    in_flight_ack = None  # id of the ack() at the kill
    stats = {
        "appended": 0,
        "acked": 0,
        "full": 0,
        "kill_in_append_present": 0,
        "kill_in_append_absent": 0,
        "kill_in_ack_applied": 0,
        "kill_in_ack_not_applied": 0,
    }
    for run in range(1, RUNS + 2):
        log_path = tmp_path / f"run{run}.log"
        proc = start(root, run, log_path)
        wait_ready(proc, log_path)
        last = run == RUNS + 1
        if not last:
            time.sleep(rng.uniform(0.0, 0.35))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        out = lines(log_path)
        assert not any(ln[0] == "BAD" for ln in out), out
        # what the reopened outbox holds, against what earlier runs reported
        ready = next(k for k, ln in enumerate(out) if ln[0] == "READY")
        got = {int(ln[1]): (int(ln[2]), ln[3], int(ln[4])) for ln in out[:ready] if ln[0] == "P"}
        if in_flight_ack is not None:
            if in_flight_ack in got:
                stats["kill_in_ack_not_applied"] += 1
            else:
                stats["kill_in_ack_applied"] += 1
                model.pop(in_flight_ack, None)
        extra = {e: v for e, v in got.items() if e not in model}
        assert len(extra) <= 1, f"entries nobody appended: {extra}"
        for e, v in extra.items():
            assert (e, v[1]) not in acked, f"entry {e} came back after its ack() returned"
            assert in_flight_append is not None and v == in_flight_append, (
                f"entry {e} {v} is not the append in flight {in_flight_append}"
            )
            model[e] = v
        if in_flight_append is not None:
            stats["kill_in_append_present" if extra else "kill_in_append_absent"] += 1
        missing = sorted(e for e in model if e not in got)
        assert not missing, f"appended entries lost: {missing} (model {sorted(model)}, got {sorted(got)})"
        assert got == model, "an entry changed on flash"
        assert int(out[ready][2]) == 0, "policy stop must never drop"
        # what this run did until the kill
        in_flight_append = in_flight_ack = None
        for ln in out[ready + 1 :]:
            if ln[0] == "APPENDING":
                i = int(ln[1])
                data = payload(run * 100000 + i, payload_len(run, i))
                in_flight_append = (len(data), f"{zlib.crc32(data):08x}", 1 + i % 7)
            elif ln[0] == "APPENDED":
                eid, i = int(ln[1]), int(ln[2])
                entry = (int(ln[3]), ln[4], int(ln[5]))
                assert entry == in_flight_append, "the worker's payload differs from the test's"
                model[eid] = entry
                acked.discard((eid, entry[1]))
                in_flight_append = None
                stats["appended"] += 1
            elif ln[0] == "FULL":
                in_flight_append = None
                stats["full"] += 1
            elif ln[0] == "ACKING":
                in_flight_ack = int(ln[1])
            elif ln[0] == "ACKED":
                eid = int(ln[1])
                acked.add((eid, model.pop(eid)[1]))
                in_flight_ack = None
                stats["acked"] += 1
    print("OUTBOX_SIGKILL", RUNS, "kills", stats)
    assert stats["appended"] > 100 and stats["acked"] > 30, stats


def test_device_with_rotten_outbox_boots_delivers_the_rest_and_counts_the_loss(mosquitto, subscriber, pki, tmp_path):
    """Issue 10 finding 7 on the real firmware (compiled, 64 KB heap): a device
    stores batches while the broker is unreachable; then bytes of an entry header
    in its oldest outbox segment rot (no CRC can correct them). On the next boot
    it must start, sample, deliver every other stored record, and count the
    records of the rotten entry in dropped_total (and log why)."""
    import json

    from mqbatch.lab.broker import free_port
    from mqbatch.lab.devices import Fleet
    from mqbatch.wire import codec, records

    dev, reader = "dev-001", ("reader", "reader-pw")
    broker = mosquitto(
        tls=True,
        allow_anonymous=False,
        users={dev: "pw-1", reader[0]: reader[1]},
        persistence=True,
        acl="user reader\ntopic read mqbatch/#\n\npattern write mqbatch/%u/#\n",
    )
    sub = subscriber(broker, "mqbatch/+/telemetry", username=reader[0], password=reader[1])
    cfg = {
        "sample_hz": 20,
        "run_for_s": 3,
        "drain_timeout_s": 1,
        "health_every_s": 1,
        "flush": {"max_count": 100, "max_bytes": 2048, "max_age_ms": 400},
        "outbox": {"segment_bytes": 4096, "segments": 8, "max_entries": 3, "policy": "drop_oldest"},
        "backoff": {"initial_ms": 200, "max_ms": 1000},
    }
    with Fleet(
        tmp_path / "fleet",
        broker.host,
        free_port(),
        credentials={dev: "pw-1"},
        ca=pki.ca_cert,
        heapsize="64K",
        config=cfg,
    ) as fleet:
        fleet.start()
        assert fleet.wait(60) == {dev: 1}, fleet.console(dev)[-2000:]  # not drained: offline
        ob = fleet.dir(dev) / "outbox"
        segs = sorted(p for p in ob.iterdir() if p.name.startswith("s"))
        assert len(segs) >= 2, segs
        img = bytearray(segs[0].read_bytes())
        at = 20 + 32 + int.from_bytes(img[20:24], "little")  # the second entry's header
        boot, first, last = (int.from_bytes(img[at + k : at + k + 4], "little") for k in (8, 12, 16))
        lost = {(dev, boot, s) for s in range(first, last + 1)}
        img[at + 8] ^= 0xFF  # 8 flipped bits in its boot field
        segs[0].write_bytes(bytes(img))
        conf = fleet.dir(dev) / "config.json"  # the broker is back
        c = json.loads(conf.read_text())
        c["broker"]["port"], c["run_for_s"], c["drain_timeout_s"] = broker.port, 2, 30
        conf.write_text(json.dumps(c))
        fleet.start_device(dev)
        assert fleet.wait(90) == {dev: 0}, fleet.console(dev)[-3000:]
        s = fleet.summaries()[dev]
        stored = fleet.stored()
        console = fleet.console(dev)
    got = set()
    for m in sub.settle(quiet=1.0):
        res = codec.decode(m.user_properties, m.payload, topic=m.topic)
        assert res.status == codec.OK, res.log
        got.update((dev, r.boot, r.seq) for r in map(records.parse, res.messages))
    assert lost and lost <= stored
    assert got == stored - lost, (sorted(stored - lost - got)[:10], sorted(got - stored)[:10])
    assert s["dropped_total"] == len(lost) and s["sampled"] > 0 and s["drained"], s
    assert f"lost on flash (unreadable): {len(lost)} records counted dropped" in console, console[-3000:]
