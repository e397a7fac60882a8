"""Memory and write-path targets of the device MQTT client, measured in the real
MicroPython Unix port against a real Mosquitto (no timing assertions):

- steady-state publishing (QoS 0 and 1, 100 x 24-byte records) allocates 0 bytes
  per PUBLISH, with gc disabled, and then runs under micropython.heap_lock();
- the client + encoder with a 4 KB batch buffer runs in `-X heapsize=64K` with TLS;
- each PUBLISH leaves with exactly one socket write (counted with strace).
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from mqbatch_testing import MICROPYTHON, mpy_env
from mqbatch_testing.broker import compile_mpy, of, run_drive

pytestmark = pytest.mark.broker

TOPIC = "mqbatch/device-1/telemetry"


def _transport(broker, pki, tls):
    t = {"host": broker.host, "port": broker.port}
    if tls:
        t.update(cafile=str(pki.ca.cert_der), server_hostname="localhost")
    else:
        t.update(plain_tcp=True)
    return t


@pytest.mark.parametrize("tls, e2e", [(False, False), (True, False), (True, True)], ids=["tcp", "tls", "tls-e2e"])
def test_steady_state_publish_allocates_nothing(tls, e2e, mosquitto, subscriber, pki, tmp_path):
    """e2e: with the ack subscription (mqb_sub) and batch-seq on every PUBLISH (mqb_packet_e2e)."""
    b = mosquitto(tls=tls)
    subscriber(b, "mqbatch/#", qos=1)  # a subscriber, so QoS 1 is acknowledged with 0x00
    plan = {
        "transport": _transport(b, pki, tls),
        "client": {"client_id": "device-1", "keepalive": 60},
        "steps": [
            ["connect", {}],
            ["service_for", {"ms": 300}],
            ["alloc", {"topic": TOPIC, "qos": 0, "n": 300}],
            ["alloc", {"topic": TOPIC, "qos": 1, "n": 300}],
            ["disconnect", {}],
        ],
    }
    if e2e:
        plan.update(subscribe="mqbatch/device-1/ack", batch_seq=[3, 1000, 1099])
    ev = run_drive(plan, tmp_path)
    assert not of(ev, "error"), ev
    assert [e["code"] for e in of(ev, "suback")] == ([1] if e2e else [])
    for a in of(ev, "alloc"):
        print(
            f"{'TLS' if tls else 'TCP'}{' e2e' if e2e else ''} QoS {a['qos']}: {a['bytes']} bytes allocated over {a['n']} publishes "
            f"of {a['size']} bytes (gc disabled); {a['locked_publishes']} more under heap_lock"
        )
        assert a["bytes"] == 0, a
        assert a["locked_publishes"] == a["n"]


def test_runs_in_64k_heap_with_tls(mosquitto, subscriber, pki, tmp_path):
    """tests/mpy/mqtt_heap.py: mutual TLS, 4 KB batch buffer, 20 + 50 QoS 1 batches.
    Modules are .mpy built with mpy-cross -O3, as for a board without frozen code: on
    the 64-bit Unix port their bytecode sits in the same 64 KB heap (~40 KB of it)."""
    b = mosquitto(tls=True, require_certificate=True)
    sub = subscriber(b, "mqbatch/#", qos=1, certfile=pki.client("reader").cert, keyfile=pki.client("reader").key)
    dev = pki.client("device-1")
    compiled = compile_mpy(tmp_path / "mpy", "-O3")
    proc = subprocess.run(
        [
            str(MICROPYTHON),
            "-X",
            "heapsize=64K",
            "-m",
            "mqtt_heap",
            b.host,
            str(b.port),
            str(pki.ca.cert_der),
            str(dev.cert_der),
            str(dev.key_der),
            "20",
        ],
        env=mpy_env(compiled),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0, proc.stderr
    fig = {
        k: int(v)
        for k, v in (line.split()[:2] for line in proc.stdout.splitlines() if line.startswith(("heap", "alloc")))
    }
    assert "acked 70 refused 0" in proc.stdout
    assert fig["alloc_50_publishes"] == 0
    assert fig["heap_total"] <= 65 * 1024 and fig["heap_peak"] < fig["heap_total"]
    assert len(sub.wait_for(70)) == 70


def _socket_writes(trace: str) -> list[int]:
    """Per strace line between the two mark events: write/sendto/sendmsg on sockets (fd > 2)."""
    counts, inside = [], False
    for line in trace.splitlines():
        if '"event": "mark"' in line or '\\"event\\": \\"mark\\"' in line:
            inside = not inside
            continue
        m = re.search(r"\b(write|sendto|sendmsg)\((\d+),.*\)\s+=\s+(-?\d+)", line)
        if inside and m and int(m.group(2)) > 2:
            counts.append(int(m.group(3)))
    return counts


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
def test_one_socket_write_per_publish(tls, mosquitto, pki, tmp_path):
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed: cannot count the client's socket writes (apt install strace)")
    probe = subprocess.run([strace, "-o", "/dev/null", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"strace cannot trace here (ptrace not permitted?): {probe.stderr.strip()}")
    b = mosquitto(tls=tls)
    n = 20
    plan = {
        "transport": _transport(b, pki, tls),
        "client": {"client_id": "device-1", "keepalive": 60},
        "steps": [
            ["connect", {}],
            ["mark", {"name": "start"}],
            ["publish", {"topic": TOPIC, "qos": 0, "batches": n}],
            ["publish", {"topic": TOPIC, "qos": 1, "batches": n, "service": False}],
            ["mark", {"name": "end"}],
            ["flush", {}],
            ["disconnect", {}],
        ],
    }
    trace = tmp_path / "strace.txt"
    ev = run_drive(
        plan, tmp_path, wrapper=[strace, "-f", "-s", "64", "-e", "trace=write,sendto,sendmsg", "-o", str(trace)]
    )
    assert not of(ev, "error"), ev
    writes = _socket_writes(trace.read_text())
    sizes = [p["size"] for p in of(ev, "published")]
    print(f"{'TLS' if tls else 'TCP'}: {len(sizes)} PUBLISHes, {len(writes)} socket writes, bytes {writes[:3]}...")
    assert len(writes) == 2 * n, writes
    if not tls:
        assert writes == sizes  # each write is exactly one whole PUBLISH
    else:
        assert all(w > s for w, s in zip(writes, sizes))  # one TLS record: the PUBLISH plus record overhead
