"""`mqbatch bench ingest`: does the recorder keep up, and in how much memory?

One run: a LocalStack (Mosquitto on loopback, TLS, dynamic-security policy) with
one more recorder account for a paho subscriber that only counts. Each
repetition measures both consumers on the same backlog, in alternating order:

  1. create the consumer's persistent session (subscribe, disconnect);
  2. publish N PUBLISHes of 100-record batches with paho (QoS 1) into it;
  3. start the consumer as a child process and time it from CONNECT to the
     N-th PUBLISH landed and acknowledged (recorder: fsync'd into the WAL before
     PUBACK) or counted (counter: paho acknowledges on receipt);
  4. read the child's peak RSS (VmHWM) and wipe the session.

The consumer drains a backlog, so its own rate is measured, not the publisher's.
Prints median [min-max] of each and the ratio recorder/counter per repetition.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import secrets
import ssl
import subprocess
import sys
import tempfile
import threading
import time

from mqbatch.bench.out import spread
from mqbatch.util.argtypes import non_negative_float

COUNTER = "bench-counter"
COUNTER_CLIENT_ID = "mqbatch-bench-counter"
DEVICE = "dev-001"
TOPIC = f"mqbatch/{DEVICE}/telemetry"
RECORDS_PER_PUBLISH = 100


def _client(login: tuple[str, str], client_id: str, cafile: str):
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    c.tls_set(ca_certs=cafile, cert_reqs=ssl.CERT_REQUIRED)
    c.username_pw_set(*login)
    return c


def _connect(c, host: str, port: int, *, clean_start: bool, expiry: int, timeout: float = 15.0):
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = expiry
    props.ReceiveMaximum = 100  # as the recorder's default
    connected = threading.Event()
    c.on_connect = lambda client, userdata, flags, rc, p: rc.is_failure or connected.set()
    c.connect(host, port, keepalive=30, clean_start=clean_start, properties=props)
    c.loop_start()
    if not connected.wait(timeout):
        raise RuntimeError(f"{c._client_id!r} could not connect to {host}:{port}")


def _session(cfg: dict, create: bool) -> None:
    """Create (subscribe, keep the session) or wipe (expiry 0) a consumer's session."""
    from paho.mqtt.subscribeoptions import SubscribeOptions

    c = _client((cfg["username"], cfg["password"]), cfg["client_id"], cfg["cafile"])
    _connect(c, cfg["host"], cfg["port"], clean_start=True, expiry=3600 if create else 0)
    if create:
        done = threading.Event()
        c.on_subscribe = lambda *a: done.set()
        c.subscribe(cfg["subscription"], options=SubscribeOptions(qos=1))
        if not done.wait(15):
            raise RuntimeError(f"{cfg['client_id']}: no SUBACK")
    c.disconnect()
    c.loop_stop()


def payloads(k: int = 16) -> list[tuple[list, bytes]]:
    """k distinct 100-record batches (batch-format v1 user properties with batch-seq, as
    a device with end-to-end acks on sends them: docs/e2e-ack.md; payload)."""
    from mqbatch.ingest import e2eack
    from mqbatch.wire import codec, records

    out = []
    for j in range(k):
        recs = [
            records.encode_binary(
                "sample",
                1,
                j * RECORDS_PER_PUBLISH + i,
                1_795_000_000_000 + i * 1000,
                [(1, 20 + i), (2, 5000 + j), (3, 3300)],
            )
            for i in range(RECORDS_PER_PUBLISH)
        ]
        props, payload = codec.encode_batch(recs)
        first = j * RECORDS_PER_PUBLISH
        seq = (e2eack.PROPERTY, e2eack.format_batch_seq(1, first, first + RECORDS_PER_PUBLISH - 1))
        out.append((list(props) + [seq], payload))
    return out


def publish(stack, n: int, batches) -> float:
    """n QoS 1 PUBLISHes as dev-001 (100 in flight); returns PUBLISH/s."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    c = _client((DEVICE, stack.credentials[DEVICE]), DEVICE, str(stack.ca_cert))
    c.max_inflight_messages_set(100)
    c.max_queued_messages_set(0)
    _connect(c, stack.broker.host, stack.broker.port, clean_start=True, expiry=0)
    props = []
    for up, _ in batches:
        p = Properties(PacketTypes.PUBLISH)
        p.UserProperty = list(up)
        props.append(p)
    t = time.monotonic()
    infos = [
        c.publish(TOPIC, batches[i % len(batches)][1], qos=1, properties=props[i % len(batches)]) for i in range(n)
    ]
    for info in infos:
        info.wait_for_publish(120)
    rate = n / (time.monotonic() - t)
    c.disconnect()
    c.loop_stop()
    return rate


# -- child processes -------------------------------------------------------------------


def _vmhwm_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def _cpu() -> float:
    """CPU seconds (user + system, all threads) of this process so far."""
    t = os.times()
    return t.user + t.system


def _child_counter(cfg: dict) -> dict:
    c = _client((cfg["username"], cfg["password"]), cfg["client_id"], cfg["cafile"])
    count, done = [0], threading.Event()

    def on_message(client, userdata, msg):
        count[0] += 1
        if count[0] >= cfg["n"]:
            done.set()

    c.on_message = on_message
    t0, cpu0 = time.monotonic(), _cpu()
    _connect(c, cfg["host"], cfg["port"], clean_start=False, expiry=3600)
    if not done.wait(cfg["timeout"]):
        raise RuntimeError(f"counter got {count[0]} of {cfg['n']} PUBLISHes")
    seconds, cpu = time.monotonic() - t0, _cpu() - cpu0
    c.disconnect()
    c.loop_stop()
    return {"seconds": seconds, "cpu": cpu, "vmhwm_kb": _vmhwm_kb()}


def _child_recorder(cfg: dict) -> dict:
    from mqbatch.ingest.recorder import Recorder, RecorderConfig

    rc = RecorderConfig(
        cfg["host"],
        cfg["port"],
        cfg["landing"],
        client_id=cfg["client_id"],
        cafile=cfg["cafile"],
        username=cfg["username"],
        password=cfg["password"],
        progress_seconds=3600,
        silence_warn_s=0,
        **cfg.get("recorder", {}),
    )
    with open(os.devnull, "w") as quiet:
        rec = Recorder(rc, out=quiet)
        stop = threading.Event()
        status = []
        th = threading.Thread(target=lambda: status.append(rec.run(stop)), daemon=True)
        t0, cpu0 = time.monotonic(), _cpu()
        th.start()
        deadline = t0 + cfg["timeout"]
        while rec.acked < cfg["n"] and th.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)  # coarse: a busy poll would take the GIL from the recorder
        seconds = time.monotonic() - t0
        landed = rec.acked
        t1 = time.monotonic()
        stop.set()
        th.join(120)
        close_s = time.monotonic() - t1  # the stop: the last acks, DISCONNECT, the final WAL -> Parquet roll
        cpu_all = _cpu() - cpu0
    if landed < cfg["n"] or status != [0]:
        raise RuntimeError(f"recorder acked {landed} of {cfg['n']} (status {status}, error {rec.error})")
    return {
        "seconds_acked": seconds,  # to the N-th PUBACK (landed and fsync'd, still in the WAL)
        "seconds": seconds + close_s,  # to every row in Parquet: what the job reads
        "cpu": cpu_all,
        "close_seconds": close_s,
        "vmhwm_kb": _vmhwm_kb(),
        "files": rec.files_rolled,
        "e2e_sent": rec.e2e_sent,
        "commit_wait_s": rc.commit_wait_s,
        "commits": rec.commits,
    }


def _run_child(role: str, cfg: dict, tmp: pathlib.Path) -> dict:
    from mqbatch.lab.broker import write_private

    path = write_private(tmp / f"{role}.json", json.dumps(cfg))  # holds a password: 0600
    out = subprocess.run(
        [sys.executable, "-m", "mqbatch.bench.ingest", role, str(path)],
        capture_output=True,
        text=True,
        timeout=cfg["timeout"] + 180,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{role} child failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main_child(argv: list[str]) -> int:
    role, path = argv
    cfg = json.loads(pathlib.Path(path).read_text())
    result = {"counter": _child_counter, "recorder": _child_recorder}[role](cfg)
    print(json.dumps(result), flush=True)
    return 0


# -- the benchmark -----------------------------------------------------------------------


def _stack(tmp: pathlib.Path, save_every_change: bool | None = None):
    """A LocalStack whose policy also has the counter's recorder account (save_every_change:
    brokerconf's broker option; None: its default)."""
    from mqbatch.lab.broker import Mosquitto
    from mqbatch.lab.stack import LocalStack

    stack = LocalStack(tmp / "stack", [DEVICE])
    login = (COUNTER, secrets.token_urlsafe(12))
    stack.policy.add_recorder(*login, client_id=COUNTER_CLIENT_ID)
    # the same broker as LocalStack's, regenerated with the extended policy (stack.py builds it in __init__)
    stack.broker = Mosquitto(
        stack.run_dir / "broker",
        certfile=stack.pki.server.cert,
        keyfile=stack.pki.server.key,
        cafile=stack.pki.ca_cert,
        persistence=True,
        **stack.policy.broker_options(
            **({} if save_every_change is None else {"save_every_change": save_every_change})
        ),
    )
    return stack, login


def _fmt(values: list[float], unit: str, spec: str = ",.0f") -> str:
    return spread(values, spec, unit, "-")


def bench_ingest(args: argparse.Namespace) -> int:
    from mqbatch.lab.stack import RECORDER_CLIENT_ID

    n = args.publishes if args.publishes else (300 if args.quick else 20_000)
    repeat = args.repeat if args.repeat else (2 if args.quick else 5)
    batches = payloads()
    size = sum(len(p) for _, p in batches) / len(batches)
    with tempfile.TemporaryDirectory(prefix="mqbatch-bench-ingest-") as tmp:
        tmp = pathlib.Path(tmp)
        stack, counter_login = _stack(tmp, args.save_every_change)
        stack.broker.start()
        try:
            common = {
                "host": stack.broker.host,
                "port": stack.broker.port,
                "cafile": str(stack.ca_cert),
                "subscription": stack.policy.share_subscription,
                "n": n,
                "timeout": 60 + n / 50,
            }
            consumers = {
                "counter": dict(
                    common, username=counter_login[0], password=counter_login[1], client_id=COUNTER_CLIENT_ID
                ),
                "recorder": dict(
                    common,
                    username=stack.recorder_login[0],
                    password=stack.recorder_login[1],
                    client_id=RECORDER_CLIENT_ID,
                ),
            }
            print(
                f"ingest bench: {n:,} PUBLISHes of {RECORDS_PER_PUBLISH} records ({size:,.0f} B payload each, "
                f"{n * size / 1e6:,.1f} MB) per consumer, {repeat} repetitions, recorder segments of "
                f"{args.roll_mb:g} MiB rolled in chunks of {args.chunk_mb:g} MiB, group commit wait "
                f"{'the default' if args.commit_wait_ms is None else f'{args.commit_wait_ms:g} ms'}, end-to-end acks "
                f"{'on' if args.e2e_ack else 'off'}, Mosquitto TLS "
                f"{'saving on every change ' if 'autosave_on_changes true' in stack.broker.config else ''}on "
                f"{stack.broker.host}:{stack.broker.port}",
                flush=True,
            )
            results: dict[str, list[dict]] = {"counter": [], "recorder": []}
            pub_rates = []
            for rep in range(repeat):
                order = ("counter", "recorder") if rep % 2 == 0 else ("recorder", "counter")
                for role in order:
                    cfg = dict(consumers[role])
                    if role == "recorder":
                        cfg["landing"] = str(tmp / f"landing-{rep}")
                        cfg["recorder"] = {
                            "roll_bytes": int(args.roll_mb * (1 << 20)),
                            "chunk_bytes": int(args.chunk_mb * (1 << 20)),
                            "e2e_ack": args.e2e_ack,
                        }
                        if args.commit_wait_ms is not None:
                            cfg["recorder"]["commit_wait_s"] = args.commit_wait_ms / 1000
                    _session(cfg, create=True)
                    pub_rates.append(publish(stack, n, batches))
                    r = _run_child(role, cfg, tmp)
                    _session(cfg, create=False)
                    results[role].append(r)
                c, r = results["counter"][-1], results["recorder"][-1]
                print(
                    f"  rep {rep + 1}: counter {n / c['seconds']:,.0f} PUBLISH/s, recorder {n / r['seconds']:,.0f} "
                    f"PUBLISH/s (ratio {c['seconds'] / r['seconds']:.2f}), recorder peak RSS "
                    f"{r['vmhwm_kb'] / 1024:,.0f} MB, counter {c['vmhwm_kb'] / 1024:,.0f} MB, "
                    f"{r['e2e_sent']:,} e2e ack PUBLISHes, {n / r['commits']:.1f} PUBLISHes per commit group "
                    f"(one write + fsync each; group commit wait {r['commit_wait_s'] * 1000:g} ms)",
                    flush=True,
                )
        finally:
            stack.broker.stop()
    cs = [n / x["seconds"] for x in results["counter"]]
    rs = [n / x["seconds"] for x in results["recorder"]]
    ratios = [c["seconds"] / r["seconds"] for c, r in zip(results["counter"], results["recorder"])]
    print(f"publisher (paho, QoS 1, 100 in flight): {_fmt(pub_rates, 'PUBLISH/s')}")
    print(
        f"counting subscriber: {_fmt(cs, 'PUBLISH/s')} = {_fmt([x * RECORDS_PER_PUBLISH for x in cs], 'records/s')}, "
        f"peak RSS {_fmt([x['vmhwm_kb'] / 1024 for x in results['counter']], 'MB')}"
    )
    print(
        f"recorder (fsync before PUBACK; timed until every row is in Parquet, the stop and final roll "
        f"included): {_fmt(rs, 'PUBLISH/s')} = {_fmt([x * RECORDS_PER_PUBLISH for x in rs], 'records/s')}, "
        f"peak RSS {_fmt([x['vmhwm_kb'] / 1024 for x in results['recorder']], 'MB')}, of which stop+final roll "
        f"{_fmt([x['close_seconds'] for x in results['recorder']], 's', '.2f')} (until the N-th PUBACK alone: "
        f"{_fmt([n / x['seconds_acked'] for x in results['recorder']], 'PUBLISH/s')})"
    )
    print(f"ratio recorder/counter (same repetition): {_fmt(ratios, '', '.2f')}")
    cpu = {k: [1000 * x["cpu"] / n for x in v] for k, v in results.items()}
    print(
        f"CPU per 1,000 PUBLISHes (all threads): counter {_fmt(cpu['counter'], 's', '.2f')}, "
        f"recorder {_fmt(cpu['recorder'], 's', '.2f')}, ratio recorder/counter "
        f"{_fmt([r / c for r, c in zip(cpu['recorder'], cpu['counter'])], '', '.2f')}"
    )
    from mqbatch.bench.out import write_result

    write_result(
        args,
        "ingest",
        {
            "publishes": n,
            "repeat": repeat,
            "records_per_publish": RECORDS_PER_PUBLISH,
            "payload_bytes": size,
            "roll_mb": args.roll_mb,
            "chunk_mb": args.chunk_mb,
            "commit_wait_ms": args.commit_wait_ms,
            "publisher_rates": pub_rates,
            "counter_rates": cs,
            "recorder_rates": rs,
            "ratios": ratios,
            "cpu_per_1000": cpu,
            "runs": results,
        },
    )
    return 0


def _commit_wait_ms(text: str) -> float:
    """RecorderConfig.commit_wait_s's range, in ms, refused in one line before any child starts."""
    from mqbatch.ingest.recorder import COMMIT_WAIT_MAX_S

    ms, most = non_negative_float(text), COMMIT_WAIT_MAX_S * 1000
    if ms > most:
        raise argparse.ArgumentTypeError(f"must be 0..{most:g} ms (RecorderConfig.commit_wait_s), got {ms:g}")
    return ms


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--publishes", type=int, default=None, help="PUBLISHes per consumer and repetition (default 20,000)")
    p.add_argument("--repeat", type=int, default=None, help="repetitions (default 5)")
    p.add_argument("--roll-mb", type=float, default=64, help="recorder segment size in MiB (default 64)")
    p.add_argument("--chunk-mb", type=float, default=8, help="recorder row-group chunk in MiB (default 8)")
    p.add_argument(
        "--commit-wait-ms",
        type=_commit_wait_ms,
        default=None,
        help="the recorder's group commit wait in ms, 0..100 (default: RecorderConfig.commit_wait_s's; 0: off)",
    )
    p.add_argument("--quick", action="store_true", help="a few seconds (CI): 300 PUBLISHes, 2 repetitions")
    p.add_argument(
        "--no-e2e-ack",
        dest="e2e_ack",
        action="store_false",
        help="the recorder publishes no end-to-end acks (the batches carry batch-seq either way)",
    )
    p.add_argument(
        "--save-every-change",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Mosquitto saves its database on every change (autosave_on_changes, autosave_interval 1), "
        "or not (default: what mqbatch.fleet.brokerconf generates); the publisher's rate is what it costs "
        "(the consumer is offline while the backlog is published)",
    )


if __name__ == "__main__":
    sys.exit(main_child(sys.argv[1:]))
