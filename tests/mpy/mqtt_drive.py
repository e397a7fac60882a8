# mqtt_drive: runs firmware/mqb_client.py in the Unix port from a JSON plan and
# prints what happened as JSON lines, for the CPython tests (tests/test_mqtt_*.py).
#
# Usage: micropython mqtt_drive.py PLAN.json
# Plan: {"transport": {Transport kwargs}, "client": {Client kwargs, "will": {Will kwargs}},
#        "subscribe": topic (optional: an mqb_sub.Subscriber; events "suback", "message"),
#        "batch_seq": [boot, first, last] (optional: every PUBLISH carries batch-seq),
#        "buf": 4096, "headroom": 96, "steps": [[name, {args}], ...]}
# Steps: connect, budget, publish, resend, flush, service_for, drop, disconnect, sleep, mark.
# Every exception a step raises is printed as {"event": "error", ...} and ends the
# plan unless the step says "continue": true.
import gc
import json
import micropython
import sys
import time
import struct
from mqb_codec import BatchEncoder
from mqb_packet_build import Will
from mqb_transport import Transport, TransportError, TLSError
from mqb_client import Client, MQTTError, BUSY

events = []


def emit(**kw):
    print(json.dumps(kw))


def on_ack(pid, code, reason):
    emit(event="ack", pid=pid, code=code, reason=reason)


def on_message(topic, buf, start, end):
    emit(event="message", topic=topic.decode(), payload=bytes(buf[start:end]).hex())


def on_suback(code, reason):
    emit(event="suback", code=code, reason=reason)


def fill(enc, batch, records, size, fill_byte=None):
    """Batch number `batch`: `records` records of `size` bytes (or until full if records
    is 0): u32 batch, u32 index, then (index & 0xFF) or fill_byte bytes. Returns the count."""
    enc.reset()
    i = 0
    while not records or i < records:
        pos = enc.reserve(size)
        if pos < 0:
            break
        struct.pack_into(">II", enc.buf, pos, batch, i)
        for j in range(8, size):
            enc.buf[pos + j] = i & 0xFF if fill_byte is None else fill_byte
        i += 1
    return i


_acks = [0]


def _count_ack(pid, code, reason):
    if code >= 0x80:
        raise MQTTError(code, "PUBACK", reason)
    _acks[0] += 1


def measure_alloc(client, enc, topic, qos, n):
    """Heap bytes allocated by n publish_batch + flush (until acknowledged) of a
    100 x 24-byte batch with the GC disabled, after a warm-up; then n more under
    micropython.heap_lock(), where any allocation raises MemoryError."""
    fill(enc, 0, 100, 24)
    saved = client.on_ack
    client.on_ack = _count_ack

    def loop(k):
        i = 0
        while i < k:
            r = client.publish_batch(enc, topic, qos)
            if r < 0:
                raise MQTTError(0x80, "PUBLISH", None, "publish_batch returned %d" % r, True)
            if client.flush(10000):
                raise MQTTError(0x80, "PUBACK", None, "not acknowledged within 10 s", True)
            i += 1

    try:
        loop(20)
        gc.collect()
        gc.disable()
        before = gc.mem_alloc()
        loop(n)
        used = gc.mem_alloc() - before
        gc.enable()
        micropython.heap_lock()
        try:
            loop(n)
        finally:
            micropython.heap_unlock()
    finally:
        gc.enable()
        client.on_ack = saved
    return dict(qos=qos, n=n, bytes=used, per_publish=used / n, locked_publishes=n, acks=_acks[0], size=client.last_size)


def _b(v):
    return v.encode() if isinstance(v, str) else v


def main():
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    tr = Transport(**plan["transport"])
    ckw = plan.get("client", {})
    if "will" in ckw:
        ckw["will"] = Will(**ckw["will"])
    ckw["on_ack"] = on_ack
    client = Client(tr, **ckw)
    if plan.get("subscribe"):
        from mqb_sub import Subscriber
        Subscriber(client, plan["subscribe"].encode(), on_message, on_suback)
    if plan.get("batch_seq"):
        import mqb_packet_build
        from mqb_packet_e2e import BatchSeq
        mqb_packet_build.batch_seq = BatchSeq()
        mqb_packet_build.batch_seq.set(*plan["batch_seq"])
    enc = BatchEncoder(bytearray(plan.get("buf", 4096) + plan.get("headroom", 128)), headroom=plan.get("headroom", 128),
                       max_count=plan.get("max_count", 100))
    batch_no = 0
    for name, args in plan["steps"]:
        try:
            if name == "connect":
                retry_until = time.ticks_add(time.ticks_ms(), args.get("retry_ms", 0))
                while True:
                    try:
                        sp = client.connect(args.get("clean_start"))
                        break
                    except TransportError as e:  # e.g. the broker is restarting: try again until retry_ms
                        if time.ticks_diff(retry_until, time.ticks_ms()) <= 0:
                            raise
                        emit(event="retry", message=str(e))
                        time.sleep_ms(100)
                ca = client.connack
                emit(event="connack", session_present=sp, receive_max=ca.receive_max, max_qos=ca.max_qos,
                     retain_available=ca.retain_available, max_packet_size=ca.max_packet_size,
                     topic_alias_max=ca.topic_alias_max, assigned_client_id=ca.assigned_client_id,
                     server_keep_alive=ca.server_keep_alive, limit=client.limit, nodelay_error=tr.nodelay_error,
                     pending_resend=client.pending_resend(), client_id=client.client_id.decode(),
                     sub_code=client.sub.code if client.sub else None)
            elif name == "budget":
                n = client.apply_budget(enc, _b(args["topic"]), args.get("qos", 1))
                emit(event="budget", payload=n, limit=enc.limit)
            elif name == "publish":
                topic = _b(args["topic"])
                for _ in range(args.get("batches", 1)):
                    count = fill(enc, batch_no, args.get("records", 100), args.get("size", 24), args.get("fill_byte"))
                    kw = dict(qos=args.get("qos", 1), retain=args.get("retain", False), expiry=args.get("expiry"),
                              content_type=_b(args.get("content_type")), payload_format=args.get("payload_format"))
                    while True:
                        r = client.publish_batch(enc, topic, **kw)
                        if r != BUSY:
                            break
                        client.service()
                        tr.wait(100)
                    emit(event="published", batch=batch_no, result=r, count=count, size=client.last_size,
                         payload=enc.payload_len, inflight=client.inflight)
                    batch_no += 1
                    if args.get("service", True):
                        client.service()
            elif name == "resend":
                # publish again, with DUP, the batches the broker may not have: same batch numbers
                topic = _b(args["topic"])
                for pid in client.pending_resend():
                    b = args["pid_to_batch"][str(pid)]
                    count = fill(enc, b, args.get("records", 100), args.get("size", 24))
                    r = client.publish_batch(enc, topic, args.get("qos", 1), resend_pid=pid)
                    emit(event="resent", pid=pid, batch=b, result=r, count=count, size=client.last_size)
            elif name == "flush":
                left = client.flush(args.get("timeout_ms", 10000))
                emit(event="flushed", inflight=left, peak_inflight=client.peak_inflight, acked=client.acked,
                     refused=client.refused)
            elif name == "service_for":
                end = time.ticks_add(time.ticks_ms(), args["ms"])
                while time.ticks_diff(end, time.ticks_ms()) > 0:
                    client.service()
                    tr.wait(50)
                emit(event="serviced", pings=client.pings, connected=client.connected)
            elif name == "drop":
                client.drop()
                emit(event="dropped")
            elif name == "disconnect":
                client.disconnect(args.get("reason", 0))
                emit(event="disconnected")
            elif name == "alloc":
                emit(event="alloc", **measure_alloc(client, enc, _b(args["topic"]), args["qos"], args.get("n", 200)))
            elif name == "mem":
                gc.collect()
                emit(event="mem", alloc=gc.mem_alloc(), free=gc.mem_free(), label=args.get("label"))
            elif name == "sleep":
                time.sleep_ms(args["ms"])
            elif name == "mark":
                emit(event="mark", name=args["name"])
            else:
                raise ValueError("unknown step %r" % name)
        except (MQTTError, TransportError, ValueError, TypeError) as e:
            ev = dict(event="error", step=name, type=type(e).__name__, message=str(e))
            if isinstance(e, MQTTError):
                ev.update(code=e.code, packet=e.packet, reason=e.reason, detail=e.detail, local=e.local,
                          server_reference=e.server_reference)
            if isinstance(e, TLSError):
                ev.update(kind=e.kind)
            emit(**ev)
            if not args.get("continue"):
                break
    emit(event="done", connected=client.connected, published=client.published, connects=client.connects)


main()
