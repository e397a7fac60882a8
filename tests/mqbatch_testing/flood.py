"""Connection-flood harness (issue 23.3): run inside a fresh network namespace
(`unshare -n`), so the generated nftables rules touch nothing of the host.

    python -m mqbatch_testing.flood RUN_DIR --connections N --broker-nofile F [--unprotected]

Starts a LocalStack broker (TLS, dynamic security, brokerconf's limits) on 127.0.0.1
with its descriptor limit set to F, applies mqbatch.fleet.brokerconf.firewall_rules
for its port (unless --unprotected, which also drops max_connections: the
configuration of main before the fix), then opens N idle TCP connections from
127.0.0.2 (nothing sent, no TLS; several processes of at most 9,000 each) and
holds them, while a legitimate device on 127.0.0.1 connects with paho (TLS,
its account) three times, 5 s deadline each. Prints one JSON line: connections
held and refused, each probe's time to CONNACK (null: none within 5 s) and
the broker's RSS before and during the flood."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from mqbatch.fleet.brokerconf import firewall_rules
from mqbatch.lab.stack import LocalStack

PER_PROCESS = 9000
ATTACKER = "127.0.0.2"

# one attacker process: open `n` idle connections from ATTACKER, report, hold until stdin closes
_ATTACK = r"""
import errno, resource, select, socket, sys, json, time
n, port, src = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held, refused, timeouts, other = [], 0, 0, 0
while n > 0:  # non-blocking connects, 500 at a time: 20,000 open in seconds, not minutes
    batch = []
    for _ in range(min(n, 500)):
        s = socket.socket()
        s.setblocking(False)
        s.bind((src, 0))
        s.connect_ex(("127.0.0.1", port))
        batch.append(s)
    n -= len(batch)
    poll, done, deadline = select.poll(), set(), time.monotonic() + 3.0
    for s in batch:
        poll.register(s, select.POLLOUT)
    while len(done) < len(batch) and time.monotonic() < deadline:
        for fd, _ in poll.poll(200):
            done.add(fd); poll.unregister(fd)
    for s in batch:
        if s.fileno() not in done:
            timeouts += 1; s.close(); continue
        err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err == 0: held.append(s)
        elif err == errno.ECONNREFUSED: refused += 1; s.close()
        else: other += 1; s.close()
print(json.dumps({"held": len(held), "refused": refused, "timeouts": timeouts, "other": other}), flush=True)
sys.stdin.read()
"""


def rss_kb(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def probe(stack: LocalStack, device: str, timeout: float = 5.0) -> float | None:
    """Seconds until the device's CONNACK (success), None if none within `timeout`."""
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=device, protocol=mqtt.MQTTv5)
    c.tls_set(ca_certs=str(stack.ca_cert))
    c.username_pw_set(device, stack.credentials[device])
    ok = threading.Event()
    c.on_connect = lambda cl, u, f, rc, p: ok.set() if not rc.is_failure else None
    t0 = time.monotonic()
    try:
        c.connect_async(stack.broker.host, stack.broker.port, keepalive=30)
        c.loop_start()
        got = ok.wait(timeout)
    finally:
        c.disconnect()
        c.loop_stop()
    return round(time.monotonic() - t0, 3) if got else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--connections", type=int, required=True)
    ap.add_argument("--broker-nofile", type=int, required=True)
    ap.add_argument("--unprotected", action="store_true")
    args = ap.parse_args(argv)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    opts = {"max_connections": None} if args.unprotected else {}
    stack = LocalStack(args.run_dir, ["dev-001"], broker_options=opts)
    if not args.unprotected:
        subprocess.run(["nft", "-f", "-"], input=firewall_rules([stack.broker.port]), text=True, check=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(args.broker_nofile, hard), hard))
    try:
        stack.broker.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    attackers = []
    try:
        pid = stack.broker.process.pid
        first = probe(stack, "dev-001")
        rss_before = rss_kb(pid)
        left = args.connections
        while left > 0:
            n = min(left, PER_PROCESS)
            attackers.append(
                subprocess.Popen(
                    [sys.executable, "-c", _ATTACK, str(n), str(stack.broker.port), ATTACKER],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
            left -= n
        counts = [json.loads(a.stdout.readline()) for a in attackers]
        time.sleep(1.0)  # let the broker accept what it will
        probes = [probe(stack, "dev-001") for _ in range(3)]
        rss_during = rss_kb(pid)
        out = {
            "connections": args.connections,
            "broker_nofile": args.broker_nofile,
            "protected": not args.unprotected,
            "held": sum(c["held"] for c in counts),
            "refused": sum(c["refused"] for c in counts),
            "timeouts": sum(c["timeouts"] for c in counts),
            "other": sum(c["other"] for c in counts),
            "probe_before_s": first,
            "probes_s": probes,
            "rss_before_kb": rss_before,
            "rss_during_kb": rss_during,
        }
        print(json.dumps(out), flush=True)
    finally:
        for a in attackers:
            a.stdin.close()
            a.wait(30)
        stack.broker.stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
