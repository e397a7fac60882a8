"""Publisher conformance: a publisher under test runs through the inspecting proxy
(mqbatch.conformance.proxy) against a matrix of Mosquitto configurations; every packet both ways
is checked (mqbatch.conformance.session) and a reference subscriber (paho-mqtt)
records what was delivered.

Default publisher: the firmware application (firmware/mqb_app.py, board `unix`) as a
virtual device in the MicroPython Unix port (mqbatch.lab.devices.Fleet), plain TCP to
the proxy. Adapter for any other publisher: a command (`cmd`, a list of arguments)
run once per scenario with these environment variables, which must publish batches
to MQBATCH_TOPIC for about MQBATCH_DURATION_S seconds, then DISCONNECT and exit:

    MQBATCH_HOST, MQBATCH_PORT   the proxy (plain TCP, MQTT 5)
    MQBATCH_TOPIC                topic to publish the batches on
    MQBATCH_CLIENT_ID            client identifier to use
    MQBATCH_QOS                  QoS to ask for (0, 1, 2)
    MQBATCH_DURATION_S           how long to keep publishing
    MQBATCH_SESSION_EXPIRY_S     session expiry to use (resume scenarios need > 0)
    MQBATCH_MAX_COUNT, MQBATCH_MAX_BYTES   the batch limits to use (sub-messages, payload bytes)
    MQBATCH_KEEPALIVE_S          the Keep Alive to ask for in CONNECT

It may print `MQBATCH-STORED <n>` (its last such line counts): the records it took
responsibility for; each must reach the witness subscriber (row PUBLISHER-DELIVERS). It must
exit 0 when it delivered what it stored.

`{host}`, `{port}`, `{topic}`, `{client_id}`, `{qos}`, `{duration}` in the arguments
are replaced too. mqbatch.conformance.paho is such a publisher (paho-mqtt).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading
import time

from mqbatch.conformance.packets import parse
from mqbatch.conformance.plan import SCENARIOS, Scenario
from mqbatch.conformance.proxy import Proxy
from mqbatch.lab.broker import Mosquitto, free_port

__all__ = ["SCENARIOS", "Scenario", "run_publisher"]

BATCH_TOPICS = ["mqbatch/+/telemetry"]


RUN_FOR_S = 4
APP_CONFIG = {
    "sample_hz": 25,
    "run_for_s": RUN_FOR_S,
    "drain_timeout_s": 15,
    "health_every_s": 1,
    "require_subscribers": False,
    "flush": {"max_count": 100, "max_bytes": 2048, "max_age_ms": 700},
    "backoff": {"initial_ms": 100, "max_ms": 400},
    "broker": {"keepalive_s": 10},
}


class Witness:
    """paho-mqtt MQTT 5 subscriber on the broker itself (not through the proxy): what was delivered."""

    def __init__(self, broker: Mosquitto, qos: int, topic: str = "mqbatch/#"):
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.messages: list[tuple[str, list, bytes]] = []
        self._ready = threading.Event()
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="conformance-witness", protocol=mqtt.MQTTv5)
        c.on_connect = lambda cl, u, f, rc, p: cl.subscribe(topic, qos=qos)
        c.on_subscribe = lambda *a: self._ready.set()
        c.on_message = lambda cl, u, m: self.messages.append(
            (m.topic, list(getattr(m.properties, "UserProperty", []) or []), bytes(m.payload))
        )
        c.connect(broker.host, broker.port, keepalive=30)
        c.loop_start()
        self.client = c
        if not self._ready.wait(10):
            self.close()
            raise RuntimeError(f"witness subscriber could not subscribe on {broker.url}")

    def close(self):
        self.client.disconnect()
        self.client.loop_stop()


def _records(messages, topic: str) -> tuple[int, int, int]:
    """(batches, sub-messages, distinct sub-messages) delivered on the publisher's batch topic.
    Delivery is judged apart from the batch rules (one check per requirement): the sub-messages
    are read from the payload's VBI framing as far as it parses, whatever the batch properties say
    (a gzip/zlib payload is inflated first)."""
    import gzip
    import zlib

    from mqbatch.conformance.packets import Malformed, read_vbi

    batches = subs = 0
    seen: set[bytes] = set()
    for t, _props, payload in messages:
        if t != topic:
            continue
        try:
            if payload[:2] == b"\x1f\x8b":
                payload = gzip.decompress(payload)
            elif payload[:1] == b"\x78":
                payload = zlib.decompress(payload)
        except (OSError, EOFError, zlib.error):
            pass  # read as it is
        batches += 1
        p = 0
        while p < len(payload):
            try:
                n, p = read_vbi(payload, p)
            except Malformed:
                break
            if p + n > len(payload):
                break
            seen.add(payload[p : p + n])
            subs += 1
            p += n
    return batches, subs, len(seen)


def _apply(proxy: Proxy, action: str, args) -> None:
    getattr(proxy, action)(*args)


class FirmwarePublisher:
    """The firmware application, one virtual device per scenario (compiled once)."""

    name = "firmware application (firmware/mqb_app.py) in the MicroPython Unix port"
    # the limits it is configured with (flush.max_count, flush.max_bytes): the proxy checks them
    limits = (APP_CONFIG["flush"]["max_count"], APP_CONFIG["flush"]["max_bytes"])

    def __init__(self, workdir: pathlib.Path, port: int, scenarios: list[Scenario], patch=None):
        """patch(fleet): called once the fleet is built, e.g. to put a mutated firmware module
        into its image (mqbatch.conformance.mutants)."""
        import json

        from mqbatch.lab.devices import Fleet

        self.devices = {s.name: f"conf-{i:02d}" for i, s in enumerate(scenarios)}
        self.fleet = Fleet(
            workdir / "fleet",
            "127.0.0.1",
            port,
            credentials={d: "pw" for d in self.devices.values()},
            tls=False,
            config=APP_CONFIG,
        )
        if patch is not None:
            patch(self.fleet)
        for s in scenarios:
            path = self.fleet.dir(self.devices[s.name]) / "config.json"
            cfg = json.loads(path.read_text())
            cfg["qos"] = s.qos
            if s.limits:
                cfg["flush"] = dict(cfg["flush"], max_count=s.limits[0], max_bytes=s.limits[1])
            if s.keepalive_s:
                cfg["broker"] = dict(cfg["broker"], keepalive_s=s.keepalive_s)
            path.write_text(json.dumps(cfg))

    def scenario_limits(self, s: Scenario) -> tuple[int, int]:
        return s.limits or self.limits

    def topic(self, s: Scenario) -> str:
        return f"mqbatch/{self.devices[s.name]}/telemetry"

    def start(self, s: Scenario):
        return self.fleet.start_device(self.devices[s.name])

    def result(self, s: Scenario, proc) -> dict:
        dev = self.devices[s.name]
        summ = self.fleet.summaries().get(dev, {})
        console = self.fleet.console(dev)
        return {
            "exit": proc.returncode,
            "stored": summ.get("stored_records"),
            "stored_records": summ.get("stored_records"),
            "acked_records": summ.get("acked_records"),
            "dropped": summ.get("dropped_total"),
            "split_batches": console.count("re-stored in smaller batches"),
            "log_tail": [ln for ln in console.splitlines() if ln.startswith("mqb:")][-6:],
        }

    def close(self):
        self.fleet.stop()


class CommandPublisher:
    """Any publisher, as a command (see the module doc)."""

    def __init__(self, cmd: list[str], port: int, limits=(100, 65536)):
        self.cmd = cmd
        self.limits = limits
        self.port = port
        self.name = "command: " + " ".join(cmd)
        self.logs: dict[str, pathlib.Path] = {}

    def topic(self, s: Scenario) -> str:
        return f"mqbatch/ext-{s.name}/telemetry"

    def scenario_limits(self, s: Scenario) -> tuple[int, int]:
        return s.limits or self.limits

    def start(self, s: Scenario):
        vals = {
            "host": "127.0.0.1",
            "port": str(self.port),
            "topic": self.topic(s),
            "client_id": f"ext-{s.name}",
            "qos": str(s.qos),
            "duration": str(RUN_FOR_S),
        }
        env = dict(
            os.environ,
            **{f"MQBATCH_{k.upper()}": v for k, v in vals.items()},
            MQBATCH_DURATION_S=str(RUN_FOR_S),
            MQBATCH_SESSION_EXPIRY_S="300",
            MQBATCH_MAX_COUNT=str(self.scenario_limits(s)[0]),
            MQBATCH_MAX_BYTES=str(self.scenario_limits(s)[1]),
            MQBATCH_KEEPALIVE_S=str(s.keepalive_s or 10),
        )
        log = tempfile.NamedTemporaryFile("w+", prefix=f"conformance-{s.name}-", suffix=".log", delete=False)
        self.logs[s.name] = pathlib.Path(log.name)
        return subprocess.Popen(
            [a.format(**vals) for a in self.cmd],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def result(self, s: Scenario, proc) -> dict:
        text = self.logs[s.name].read_text(errors="replace")
        self.logs[s.name].unlink()
        stored = [ln.split()[1] for ln in text.splitlines() if ln.startswith("MQBATCH-STORED ") and len(ln.split()) > 1]
        return {
            "exit": proc.returncode,
            "stored": int(stored[-1]) if stored and stored[-1].isdigit() else None,
            "log_tail": text.splitlines()[-6:],
        }

    def close(self):
        pass


def run_publisher(
    scenarios: list[Scenario],
    workdir: str | os.PathLike,
    cmd: list[str] | None = None,
    timeout: float = 60,
    progress=print,
    limits=(100, 65536),
    patch=None,
) -> dict:
    """Run every scenario; return {"publisher", "limits", "scenarios": [result...]}. limits: the
    (batch-size, payload bytes) limits a command publisher is configured with (spec §3.3
    defaults unless told); the firmware's come from its configuration."""
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    pub = CommandPublisher(cmd, port, limits) if cmd else FirmwarePublisher(workdir, port, scenarios, patch)
    out = []
    try:
        for s in scenarios:
            t0 = time.monotonic()
            out.append(_run_one(s, pub, port, workdir / s.name, timeout))
            d = out[-1]["delivery"]
            progress(
                f"  {s.name}: {len(out[-1]['violations'])} violations, delivery "
                f"{'ok' if d['ok'] else 'FAILED: ' + d['why']}, {time.monotonic() - t0:.1f} s"
            )
    finally:
        pub.close()
    return {"publisher": pub.name, "limits": list(pub.limits), "scenarios": out}


def _run_one(s: Scenario, pub, port: int, bdir: pathlib.Path, timeout: float) -> dict:
    shutil.rmtree(bdir, ignore_errors=True)
    broker = Mosquitto(bdir, **s.broker).start()
    witness = Witness(broker, s.broker.get("max_qos", 2))
    lim = pub.scenario_limits(s)
    proxy = Proxy(
        broker.host,
        broker.port,
        port=port,
        batch_topics=BATCH_TOPICS,
        max_batch_size=lim[0],
        max_payload_bytes=lim[1],
        hold_acks=s.hold_acks,
        hold_s=s.hold_s,
        max_packet_probe=s.max_packet_probe,
        lose_sessions=s.lose_sessions,
    ).start()
    if s.hold_connects_s:
        proxy.refuse_connects(True)
    pending = sorted(s.faults, key=lambda f: f[0])
    if s.hold_connects_s:
        pending = sorted(pending + [(s.hold_connects_s, "refuse_connects", (False,))], key=lambda f: f[0])
    killed = False
    try:
        start = time.monotonic()
        proc = pub.start(s)
        while proc.poll() is None:
            now = time.monotonic() - start
            while pending and pending[0][0] <= now:
                _, action, args = pending.pop(0)
                _apply(proxy, action, args)
            if now > timeout:
                killed = True
                proc.kill()
                proc.wait()
                break
            time.sleep(0.05)
        time.sleep(0.5)  # the witness's last deliveries
        proxy.unstall()
    finally:
        proxy.stop()
        witness.close()
        broker.stop()
    batches, subs, distinct = _records(witness.messages, pub.topic(s))
    result = pub.result(s, proc)
    return {
        "scenario": s.name,
        "what": s.what,
        "broker": s.broker,
        "qos": s.qos,
        "topic": pub.topic(s),
        "seconds": round(time.monotonic() - start, 1),
        "publisher": result,
        "limits": list(lim),
        "hold_acks": s.hold_acks,
        "firmware_fails": s.firmware_fails,
        "delivered": {"batches": batches, "records": subs, "distinct": distinct},
        "delivery": _delivery(result, distinct, killed, timeout),
        "max_packet_size": s.broker.get("max_packet_size"),
        "probe_limits": sorted(proxy.probe.told.values()) if proxy.probe else [],
        "probe_exact": sum(1 for n, lim in proxy.probe.told.items() if proxy.probe.largest.get(n) == lim)
        if proxy.probe
        else 0,
        "violations": [dataclasses.asdict(v) for v in proxy.violations],
        "applied": {f"{d} {r}": n for (d, r), n in sorted(proxy.checker.applied.items())},
        "peak_inflight": {d: list(v) for d, v in proxy.checker.peak.items()},
        "packets": {f"{d} {n}": c for (d, n), c in sorted(proxy.packets_by_type.items())},
        "bytes": {f"{d} {n}": c for (d, n), c in sorted(proxy.bytes_by_type.items())},
        "max_publish": max((len(r.raw) for r in proxy.packets("PUBLISH", "c2s")), default=0),
        "dup_publishes": sum(1 for r in proxy.packets("PUBLISH", "c2s") if r.raw[0] & 8),
        "connections": proxy.connections,
        "connack_codes": _connack_codes(proxy),
        "trace": proxy.trace(limit=8, around_faults=6),
        "violation_traces": _excerpts(proxy),
    }


def _delivery(result: dict, distinct: int, killed: bool, timeout: float) -> dict:
    """Row PUBLISHER-DELIVERS for one scenario: the publisher exited 0 by itself, and every record it
    reports stored (at least one) reached the witness subscriber, except those it reports it dropped
    and counted (the firmware's dropped_total: e.g. records that can never fit the broker's Maximum
    Packet Size). A publisher that loses records without counting them fails."""
    stored = result.get("stored")
    why = []
    if killed:
        why.append(f"still running after {timeout:.0f} s: killed")
    elif result["exit"] != 0:
        why.append(f"exit status {result['exit']}")
    if distinct == 0:
        why.append("no record reached the witness subscriber")
    elif stored is not None and distinct < stored - (result.get("dropped") or 0):
        dropped = result.get("dropped") or 0
        why.append(
            f"{stored} records stored, {distinct} distinct reached the witness"
            + (f" ({dropped} counted dropped by the publisher)" if dropped else "")
        )
    return {
        "ok": not why,
        "why": "; ".join(why),
        "stored": stored,
        "distinct": distinct,
        "exit": None if killed else result["exit"],
    }


def _connack_codes(proxy: Proxy) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in proxy.packets("CONNACK", "s2c"):
        k = f"0x{parse(r.raw).fields.get('reason', 0):02x}"
        out[k] = out.get(k, 0) + 1
    return out


def _excerpts(proxy: Proxy) -> list[str]:
    """A trace excerpt around the first violation of each rule."""
    seen, out = set(), []
    for v in proxy.violations:
        if v.rule in seen:
            continue
        seen.add(v.rule)
        recs = [r for r in proxy.packets() if r.conn == v.conn]
        lo = max(0, v.index - 3)
        out.append(
            f"[{v.rule}] conn {v.conn}:\n"
            + "\n".join(
                f"  {'>>' if i == v.index else '  '} #{i} {r.direction} {r.summary()}"
                for i, r in enumerate(recs)
                if lo <= i <= v.index + 1
            )
        )
    return out
