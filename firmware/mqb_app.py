# mqb_app: the device application.
#
#   sample (board) -> record (mqb_record) -> batch (mqb_codec) -> outbox on flash
#   (mqb_outbox) -> MQTT 5 PUBLISH, QoS 1 (mqb_client) -> PUBACK -> outbox entry removed
#
# One non-blocking loop: samples are taken on a ticks schedule, a batch is
# sealed into the outbox when it is full (count or bytes) or max_age_ms old, and
# the network is serviced in between (connect with backoff, drain the outbox
# oldest first within Receive Maximum, acks, keep alive). When the broker is
# unreachable the device keeps sampling into the outbox. A connection attempt
# blocks for at most broker.connect_timeout_ms; samples that fall due meanwhile
# are taken right after, with their true timestamps (late, never skipped).
#
# Records are durable once their batch is in the outbox ("stored"); the open
# batch in RAM (at most max_age_ms of samples) is lost on a power cut.
# See docs/application.md.
import gc
import json
import os
import time
from array import array
from micropython import const

import mqb_board as board
import mqb_packet as P
import mqb_record as R
from mqb_boot import BootCounter
from mqb_client import BUSY, SESSION_LOST, Client, MQTTError
from mqb_codec import FULL, BatchEncoder, vbi_read, vbi_size
from mqb_outbox import CORRUPT, TOO_SMALL, UNKNOWN, Outbox
from mqb_outbox import FULL as OUTBOX_FULL
from mqb_transport import TransportError

# RAM: every public global of a module costs heap on a board even when its code
# runs from flash (a dict entry, its name); constants are private const() values
# below (folded into the bytecode), the defaults are built only when a config is
# made, and an App keeps the config values it uses, not the config dict.
def defaults():
    """The configuration defaults (a fresh dict; the device's config.json overrides them)."""
    return {
        "topic": "mqbatch/{device_id}/telemetry",
        "status_topic": "mqbatch/{device_id}/status",
        "qos": 1,
        # lowest QoS the app publishes at when the broker's Maximum QoS is below "qos":
        # 0 sends at QoS 0 (no acknowledgement: a batch stays in the outbox until the broker
        # answers a PINGREQ sent after it); 1 keeps every batch in the outbox instead
        "min_qos": 0,
        "sample_hz": 10,
        "record_format": "binary",
        # flush.max_bytes: RAM for two batch buffers of max_bytes + header room (main.py: + 160 bytes)
        "flush": {"max_count": 100, "max_bytes": 4096, "max_age_ms": 5000},
        # outbox RAM index: segments x max_entries x 7 bytes (docs/outbox.md)
        "outbox": {"segment_bytes": 16384, "segments": 8, "max_entries": 32, "policy": "drop_oldest"},
        "health_every_s": 10,
        "backoff": {"initial_ms": 500, "max_ms": 30000},
        "run_for_s": None,          # None: run forever
        "drain_timeout_s": 60,      # after run_for_s: how long to keep sending the outbox
        # PUBACK 0x10 "No matching subscribers" is a success code in MQTT, but it means the
        # broker delivered the batch to nobody (e.g. the recorder's shared subscription is
        # not back yet after a broker restart): keep the batch and send it again later.
        "require_subscribers": True,
        # HMAC-SHA256 key (hex, 16..64 bytes) signing every batch as User Property
        # batch-hmac (docs/format.md); null: batches go unsigned
        "hmac_key": None,
        "broker": {"port": None, "tls": True, "ca": None, "server_hostname": None, "client_cert": None,
                   "client_key": None, "username": None, "password": None, "keepalive_s": 30,
                   "session_expiry_s": 3600, "receive_max": 4, "connect_timeout_ms": 3000},
    }


# Broker refusals worth retrying later (the batch stays in the outbox); any other
# code >= 0x80 on a PUBACK is final: the batch is discarded and its records counted
# as dropped on the device (health record dropped_total), never silently.
_TRANSIENT = const(b"\x80\x83\x89\x97")   # Unspecified, Implementation specific, Server busy, Quota exceeded
_NO_MATCHING_SUBSCRIBERS = const(0x10)
_SUB_PENDING = const(-1)                  # mqb_sub._PENDING: a SUBSCRIBE awaits its SUBACK
_BATCH_SEQ_ROOM = const(46)               # the batch-seq property at its largest (mqb_packet_e2e.BatchSeq)
_USE_ANOTHER_SERVER = const(0x9C)
_SERVER_MOVED = const(0x9D)

# The health record's channels, in the order _health() fills them (mqb_record.CH_*,
# docs/records.md): free_heap 0x80, outbox_depth 0x81, dropped_total 0x82,
# reconnects 0x83, last_error 0x84, sampled_total 0x85, outbox_bytes 0x86
_HEALTH_CHANNELS = const(b"\x80\x81\x82\x83\x84\x85\x86")

# Indexes of App.count
_SAMPLED = const(0)
_STORED_RECORDS = const(1)
_STORED_BATCHES = const(2)
_ACKED_BATCHES = const(3)
_ACKED_RECORDS = const(4)
_REFUSED_BATCHES = const(5)
_UNHEARD = const(6)            # PUBACK 0x10: nobody subscribed; kept and resent
_RECONNECTS = const(7)
_CONNECTS = const(8)
_LAST_ERROR = const(9)
_MISSED_SAMPLES = const(10)
_PUBLISHES = const(11)
_PEAK_HEAP = const(12)         # highest gc.mem_alloc() seen after a step (live objects + garbage)
_PEAK_HEAP_LIVE = const(13)    # highest gc.mem_alloc() right after a gc.collect() (_measure_live)
_QOS0_BATCHES = const(14)      # sent at QoS 0 and read by the broker (PINGRESP after them): no delivery ack
_QOS0_RECORDS = const(15)
_QOS0_PING = const(16)         # QoS 0: number of the PINGREQ whose PINGRESP confirms the batches sent (0: none)
_N_COUNTS = const(17)

# Indexes of App.qos
_QOS_CFG = const(0)
_QOS_PUB = const(1)
_QOS_MIN = const(2)


class ConfigError(ValueError):
    pass


def _merge(dst, src):
    for k in src:
        v = src[k]
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = v
    return dst


def load_config(path="config.json"):
    """Read the device config (boards/<board>/config.template.json) over the defaults."""
    try:
        with open(path) as f:
            user = json.load(f)
    except OSError as e:
        raise ConfigError("cannot open %s: %s" % (path, e))
    except ValueError as e:
        raise ConfigError("%s is not valid JSON: %s" % (path, e))
    return make_config(user)


def _check_types(user, ref, path):
    # Every value given must have the type of its default (a number where the default
    # is one); the host runs this before a deploy (mqbatch.deploy.check_config).
    for k in user:
        v = user[k]
        d = ref.get(k)
        if d is None:
            # no default to compare with: the broker's optional names and port
            d = "" if k in ("ca", "server_hostname", "client_cert", "client_key", "username",
                            "password") else 0 if k in ("port", "run_for_s") else None
            if d is None or v is None:
                continue
        if isinstance(d, dict):
            if not isinstance(v, dict):
                raise ConfigError("%s%s must be an object, got %r" % (path, k, v))
            _check_types(v, d, path + k + ".")
        elif isinstance(d, (bool, str)):
            if type(v) is not type(d):
                raise ConfigError("%s%s must be a %s, got %r" % (path, k, "boolean" if d is True or d is False
                                                                 else "string", v))
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError("%s%s must be a number, got %r" % (path, k, v))


def make_config(user):
    if not isinstance(user, dict):
        raise ConfigError("the config must be a JSON object")
    _check_types(user, defaults(), "")
    cfg = _merge(defaults(), user)
    for key in ("device_id",):
        if not cfg.get(key) or not isinstance(cfg[key], str):
            raise ConfigError("config lacks %r (a string)" % key)
    b = cfg["broker"]
    if not b.get("host") or not isinstance(b["host"], str):
        raise ConfigError("config lacks broker.host (a string: the broker's host name or address)")
    if b["tls"] and not b["ca"]:
        raise ConfigError("broker.tls is on but broker.ca (the CA certificate file) is not set; "
                          "plain TCP must be chosen explicitly with broker.tls = false")
    if cfg["qos"] not in (0, 1, 2):
        raise ConfigError("qos must be 0, 1 or 2, got %r" % cfg["qos"])
    if cfg["min_qos"] not in (0, 1, 2) or cfg["min_qos"] > cfg["qos"]:
        raise ConfigError("min_qos must be 0, 1 or 2 and at most qos (%r), got %r" % (cfg["qos"], cfg["min_qos"]))
    if not 0 < cfg["sample_hz"] <= 1000:
        raise ConfigError("sample_hz must be in (0, 1000], got %r" % cfg["sample_hz"])
    hmac_key(cfg)
    if cfg.get("e2e_ack") is not None:
        # end-to-end acks (docs/e2e-ack.md): "e2e_ack": {"enabled": bool, "resend_after_s": 30}.
        # Its defaults and checks live in mqb_e2e: in this module they would cost heap on
        # every device (a default's dict entry, each message). When disabled, mqb_e2e
        # removes the key (and unloads itself): cfg["e2e_ack"] present means enabled
        import mqb_e2e
        mqb_e2e.make_config(cfg, ConfigError)
    return cfg


def hmac_key(cfg):
    """The batch-hmac key from cfg["hmac_key"] (hex text) as bytes, or None."""
    text = cfg.get("hmac_key")
    if text is None:
        return None
    from binascii import unhexlify    # here, not a module global: each global costs heap
    try:
        key = unhexlify(text)
    except (TypeError, ValueError):
        raise ConfigError("hmac_key must be hex text (2 digits per byte)")
    if not 16 <= len(key) <= 64:
        raise ConfigError("hmac_key of %d bytes: must be 16..64 bytes" % len(key))
    return key


class App:
    """The application state. run() is the main loop; step() one iteration (tests)."""

    def __init__(self, cfg, flash=None, buffers=None, ssl_context=None):
        """cfg: from make_config(). buffers: two equal bytearrays for the batch and
        send buffers, and ssl_context: a tls.SSLContext(tls.PROTOCOL_TLS_CLIENT) for
        broker.tls (main.py makes both before the imports, while the heap still has
        free runs of their size); else made here."""
        self.flash = flash or board.flash_dir()
        self.device_id = dev = cfg["device_id"]
        self.topic = cfg["topic"].format(device_id=dev).encode()
        # qos[_QOS_CFG] as configured, qos[_QOS_PUB] this connection's (lowered to the broker's
        # Maximum QoS), qos[_QOS_MIN] min_qos. One bytearray: in a 64 KB heap one more
        # attribute can make the instance dict grow by ~1 KB.
        self.qos = bytearray((cfg["qos"], cfg["qos"], cfg["min_qos"]))
        fl = cfg["flush"]
        self.max_age_ms = fl["max_age_ms"]
        headroom = 64 + len(self.topic)
        max_bytes = fl["max_bytes"]
        key = hmac_key(cfg)
        self.mac = None
        extra = 0
        if key is not None:
            # every batch PUBLISH carries batch-hmac (docs/format.md): 79 more header bytes
            from mqb_hmac import BatchMac   # imported only when used: a module costs heap on a board
            self.mac = BatchMac(key)
            extra = P.BATCH_MAC_PROPERTY_LEN
        e2e = cfg.get("e2e_ack")
        if e2e is not None:
            extra += _BATCH_SEQ_ROOM        # the batch-seq property at its largest (docs/e2e-ack.md)
        headroom += extra
        if extra and buffers is not None and min(len(b) for b in buffers) - headroom < max_bytes:
            max_bytes = min(len(b) for b in buffers) - headroom
            log("flush.max_bytes %d lowered to %d: the batch-hmac / batch-seq properties take %d bytes of the "
                "batch buffers" % (fl["max_bytes"], max_bytes, extra))
        P.batch_mac = self.mac.hex if self.mac is not None else None
        # two buffers: one fills with samples while the other sends a stored batch
        need = headroom + max_bytes
        if buffers is None:
            buffers = (bytearray(need), bytearray(need))
        for b in buffers:
            if len(b) < need:
                raise ConfigError("batch buffer of %d bytes < %d needed (flush.max_bytes %d + %d header room)"
                                  % (len(b), need, max_bytes, headroom))
        self.enc = BatchEncoder(buffers[0], headroom, fl["max_count"], max_bytes)
        self.out = BatchEncoder(buffers[1], headroom, fl["max_count"], max_bytes)
        self.out_view = memoryview(self.out.buf)[headroom:]
        board.init(cfg)
        self.boot = BootCounter(self.flash + "/mqb_boot").next()
        self.clock = R.TickClock()
        self.clock.set_from_rtc(board.time_synced())
        ob = cfg["outbox"]
        self.outbox = Outbox(self.flash + "/outbox", ob["segment_bytes"], ob["segments"], ob["max_entries"],
                             ob["policy"])
        if self.outbox.max_payload < max_bytes:
            raise ConfigError("outbox.segment_bytes %d holds batches of up to %d bytes, less than flush.max_bytes %d"
                              % (ob["segment_bytes"], self.outbox.max_payload, max_bytes))
        self.writer = R.RecordWriter(self.enc, self.clock, self.boot, cfg["record_format"], self._renew_boot)
        self.channels = bytes(board.CHANNELS)
        self.values = array("i", bytes(4 * len(self.channels)))
        self.health_values = array("i", bytes(4 * len(_HEALTH_CHANNELS)))
        self.record_size = R.HEADER_SIZE + R.READING_SIZE * len(self.channels)
        # the config values used after start-up (the config dict itself is not kept)
        self.net_cfg = {"wifi": cfg["wifi"]} if "wifi" in cfg else {}    # board.network_connect()
        bo = cfg["backoff"]
        self.backoff_ms = bo["initial_ms"]
        self.backoff_max_ms = bo["max_ms"]
        self.require_subscribers = cfg["require_subscribers"]
        self.run_for_s = cfg["run_for_s"]
        self.drain_timeout_s = cfg["drain_timeout_s"]
        self.client = self._make_client(cfg, ssl_context)
        rm = self.client.receive_max
        self._pid = array("H", bytes(2 * rm))      # in flight: packet id -> outbox entry id
        self._eid = array("i", b"\xff" * (4 * rm))  # -1: free
        self._ids = array("i", bytes(4))
        # schedule
        now = time.ticks_ms()
        self.period_ms = max(1, int(1000 / cfg["sample_hz"]))
        self.next_sample = now
        self.next_health = now
        self.health_ms = int(cfg["health_every_s"] * 1000)
        self.batch_started = now
        self.batch_first_seq = 0
        self.batch_reported = -1
        self.next_connect = now
        self.hold_until = now
        self.backoff_n = 0
        self.hold_n = 0            # refusals (0x10, transient codes) in a row
        self.connected_at = now
        self._resend_pending = False
        self.cursor = -1           # highest outbox id sent on this connection
        self.sampling = True
        self.paused = False        # outbox full with policy "stop"
        # counters (health records and the final summary): one array, indexed by the
        # _SAMPLED.. constants above (an attribute each would cost a dict slot each)
        self.count = array("i", bytes(4 * _N_COUNTS))
        self.wire_bytes = 0        # may pass 2**31 on a long run: not in the int32 array
        P.batch_seq = None
        if e2e is not None:
            import mqb_e2e                  # imported only when used: a module costs heap on a board
            # the E2E registers itself as self.client.sub: the App keeps no attribute for it
            # (one more can grow the instance dict by ~1 KB in a 64 KB heap)
            P.batch_seq = mqb_e2e.init(self.client, self.topic, e2e, self.outbox, self.count, log).seq
        log("boot %d, device %s, outbox %d entries (%d records) pending" % (
            self.boot, dev, self.outbox.depth, self.outbox.pending_records))
        for reason, first, end, n in self.outbox.damage:   # flash rot found on open (docs/outbox.md)
            if n < 0:
                log("outbox segment %08x unreadable (%s): its entries are lost, not counted" % (first, reason))
            else:
                log("outbox entries %d..%d lost on flash (%s): %d records counted dropped" % (first, end - 1, reason, n))

    def _make_client(self, cfg, ssl_context):
        from mqb_transport import Transport
        b = cfg["broker"]
        transport = Transport(b["host"], b["port"], cafile=b["ca"] if b["tls"] else None,
                                   certfile=b["client_cert"], keyfile=b["client_key"],
                                   server_hostname=b["server_hostname"], plain_tcp=not b["tls"],
                                   timeout_ms=b["connect_timeout_ms"], ssl_context=ssl_context)
        status = cfg["status_topic"].format(device_id=cfg["device_id"])
        will = P.Will(status, b"offline", qos=1, retain=True)
        return Client(transport, cfg["device_id"], b["username"], b["password"], b["keepalive_s"],
                      b["session_expiry_s"], b["receive_max"], will=will, on_ack=self._on_ack,
                      timeout_ms=b["connect_timeout_ms"])

    def _renew_boot(self):
        self.boot = BootCounter(self.flash + "/mqb_boot").next()
        self.outbox.rebase()
        return self.boot

    # ---- sampling and batching ------------------------------------------------

    def _sample(self):
        board.sample(self.values)
        seq = self.writer.sample(self.channels, self.values)
        if seq == FULL:
            if not self._seal():
                return False
            seq = self.writer.sample(self.channels, self.values)
        self._added(seq)
        self.count[_SAMPLED] += 1
        return True

    def _measure_live(self):
        """Collect, then note the heap in use: live objects only. Called once per
        health record and after each connect (never on the per-sample path)."""
        gc.collect()
        used = gc.mem_alloc()
        if used > self.count[_PEAK_HEAP_LIVE]:
            self.count[_PEAK_HEAP_LIVE] = used

    def _health(self):
        v = self.health_values
        ob = self.outbox
        self._measure_live()
        v[0] = gc.mem_free()
        v[1] = ob.depth
        v[2] = ob.dropped_report()
        v[3] = self.count[_RECONNECTS]
        v[4] = self.count[_LAST_ERROR]
        v[5] = self.count[_SAMPLED]
        v[6] = ob.bytes_used
        seq = self.writer.health(_HEALTH_CHANNELS, v)
        if seq == FULL:
            if not self._seal():
                return False
            seq = self.writer.health(_HEALTH_CHANNELS, v)
        self.batch_reported = v[2]     # this batch carries the report (before _added may seal it)
        self._added(seq)
        return True

    def _added(self, seq):
        enc = self.enc
        if enc.count == 1:
            self.batch_started = time.ticks_ms()
            self.batch_first_seq = seq
        # seal as soon as the next record could not fit
        if enc.count >= enc.max_count or enc.limit - enc.payload_len < self.record_size + 2:
            self._seal()

    def _seal(self):
        """Move the open batch into the outbox. False if the outbox refused (policy stop)."""
        enc = self.enc
        if not enc.count:
            return True
        last = self.writer.seq - 1
        eid = self.outbox.append(enc.payload(), enc.count, self.writer.boot, self.batch_first_seq, last,
                                 self.batch_reported)
        if eid == OUTBOX_FULL:
            if not self.paused:
                log("outbox full (policy stop): sampling paused")
            self.paused = True
            return False
        if self.paused:
            log("outbox has room again: sampling resumed")
        self.paused = False
        self.count[_STORED_RECORDS] += enc.count
        self.count[_STORED_BATCHES] += 1
        print("MQB-STORED %d %d %d %d" % (eid, self.writer.boot, self.batch_first_seq, last))
        enc.reset()
        self.batch_reported = -1
        return True

    # ---- network --------------------------------------------------------------

    def _backoff(self, now):
        delay = self.backoff_ms << min(self.backoff_n, 16)
        if delay > self.backoff_max_ms:
            delay = self.backoff_max_ms
        delay = delay // 2 + (int.from_bytes(os.urandom(2), "little") * (delay // 2)) // 65536  # jitter
        self.backoff_n += 1
        self.next_connect = time.ticks_add(now, delay)
        return delay

    def _connect(self, now):
        c = self.client
        if not board.network_up() and not board.network_connect(self.net_cfg):
            log("network down; retry in %d ms" % self._backoff(now))
            return
        if not self.clock.synced and board.sync_time():
            self.clock.set_from_rtc(True)
        self.count[_QOS0_PING] = 0
        for i in range(len(self._eid)):
            if self._pid[i] == 0:
                if self.client.sub is not None and self._eid[i] >= 0:
                    self.client.sub.discard(self._eid[i])
                self._eid[i] = -1       # QoS 0 batches the broker did not confirm: sent again
        try:
            present = c.connect()
            # publish at min(qos, the broker's Maximum QoS) (MQTT 5 3.3.1.2 lets a client
            # publish lower), logged when it changes; below min_qos nothing is sent
            top = c.connack.max_qos
            qos = self.qos
            q = qos[_QOS_CFG] if qos[_QOS_CFG] < top else top
            if q < qos[_QOS_MIN]:
                c.drop()
                raise MQTTError(P.QOS_NOT_SUPPORTED, "CONNACK", None, "broker's Maximum QoS %d is below min_qos %d: "
                                "batches stay in the outbox, none is sent until the broker allows QoS %d"
                                % (top, qos[_QOS_MIN], qos[_QOS_MIN]), True)
            if q != qos[_QOS_PUB]:
                log("broker Maximum QoS %d: batches published at QoS %d (config qos %d)%s"
                    % (top, q, qos[_QOS_CFG], "; each stays in the outbox until the broker answers a PINGREQ sent "
                       "after it" if q == 0 else ""))
                qos[_QOS_PUB] = q
            if self.count[_CONNECTS]:
                self.count[_RECONNECTS] += 1
            self.count[_CONNECTS] += 1
            self.connected_at = now
            self.cursor = -1
            # batches must fit the broker's Maximum Packet Size from now on (MQTTError
            # if its limit leaves no room for a batch at all)
            c.apply_budget(self.enc, self.topic, self.qos[_QOS_PUB])
            c.apply_budget(self.out, self.topic, self.qos[_QOS_PUB])
            self._resend_pending = present   # _drain() sends them first, within Receive Maximum
            self._measure_live()
            log("connected (session present %d, receive max %d, max packet %d, batch payload limit %d)"
                % (present, c.limit, c.max_send_size, self.enc.limit))
        except (MQTTError, TransportError) as e:
            self._failed(e, now)

    def _failed(self, e, now):
        """A connection attempt or an established link failed: log the reason code, back off."""
        if isinstance(e, MQTTError):
            self.count[_LAST_ERROR] = e.code
            ref = e.server_reference
            if e.code in (_USE_ANOTHER_SERVER, _SERVER_MOVED) and ref:
                self._use_server(ref)
            if e.packet == "CONNACK":
                # the broker refused the Will (MQTT 5 3.2.2.3: 0x9B its QoS, 0x9A its retain
                # flag): lower it and connect again at once
                w = self.client.will
                if not e.local and (e.code == P.QOS_NOT_SUPPORTED and w.qos or
                                    e.code == P.RETAIN_NOT_SUPPORTED and w.retain):
                    if e.code == P.QOS_NOT_SUPPORTED:
                        w.qos -= 1
                        log("broker refused the Will's QoS (CONNACK 0x9B): the Will is now sent at QoS %d" % w.qos)
                    else:
                        w.retain = False
                        log("broker refused a retained Will (CONNACK 0x9A Retain not supported): "
                            "the Will is now sent unretained")
                    self.next_connect = now
                    log("link: %s; reconnecting now" % e)
                    return
                if e.local and e.code == P.QOS_NOT_SUPPORTED:
                    self.backoff_n = 16          # below min_qos: only a broker change helps, try seldom
        else:
            code = e.errno
            self.count[_LAST_ERROR] = -abs(code) if isinstance(code, int) and code else -1
        if self.client.connected:
            self.client.drop()
        if self.backoff_n and time.ticks_diff(now, self.connected_at) > 30000:
            self.backoff_n = 0       # the link had been up a while: start the backoff again
        log("link: %s; retry in %d ms" % (e, self._backoff(now)))

    def _use_server(self, ref):
        host, _, port = ref.partition(":")
        self.client.transport.host = host
        if port:
            self.client.transport.port = int(port)
        log("server reference: next connect goes to %s" % ref)

    def _slot(self, pid):
        for i in range(len(self._pid)):
            if self._eid[i] >= 0 and self._pid[i] == pid:
                return i
        return -1

    def _in_flight(self, eid):
        for i in range(len(self._eid)):
            if self._eid[i] == eid:
                return True
        return False

    def _load(self, eid):
        """Read a stored batch into the send buffer; its length, or < 0 if it cannot be
        sent now (gone, corrupt, or re-stored in smaller batches)."""
        n = self.outbox.read(eid, self.out_view)
        if n == CORRUPT:
            log("outbox entry %d failed its CRC: discarded, records counted dropped" % eid)
            return n
        if n == UNKNOWN:
            return n
        if n == TOO_SMALL:
            # stored with a larger flush.max_bytes than this boot's: read it into a
            # scratch buffer and store it again in batches that fit
            h = self.out.headroom
            try:
                scratch = bytearray(h + self.outbox.entry_bytes)
            except MemoryError:
                log("outbox entry %d is larger than the send buffer and no scratch buffer fits in RAM: "
                    "kept, tried again on the next connection" % eid)
                return TOO_SMALL
            return self._split(eid, self.outbox.read(eid, memoryview(scratch)[h:]), scratch)
        if n > self.out.limit:
            return self._split(eid, n, self.out.buf)
        self.out.load(n, self.outbox.entry_records)
        return n

    def _split(self, eid, n, buf):
        """A stored batch (its n payload bytes at buf[headroom:]) larger than this
        connection allows: store its sub-messages again as batches that fit, then
        remove the original. Nothing is dropped. If the outbox refuses a part (policy
        stop, outbox full), the original is kept and sent whole later; the parts
        already stored then arrive twice, which downstream de-duplication absorbs."""
        ob = self.outbox
        boot, seq = ob.entry_boot, ob.entry_first_seq
        h = self.out.headroom
        limit = min(self.out.limit, ob.max_payload)
        try:
            part = BatchEncoder(bytearray(h + limit), h, self.out.max_count, limit)
        except MemoryError:
            log("outbox entry %d (%d bytes) needs splitting but no buffer fits in RAM: kept" % (eid, n))
            return TOO_SMALL
        pos, end = h, h + n
        while pos < end:
            k = vbi_read(buf, pos, end)
            if k < 0:
                ob.discard(eid)      # the entry passed its CRC, so this cannot happen unless RAM is corrupt
                log("outbox entry %d holds a malformed batch: discarded, records counted dropped" % eid)
                return CORRUPT
            start = pos + vbi_size(k)
            if not part.add(memoryview(buf)[start:start + k]):
                if ob.append(part.payload(), part.count, boot, seq, seq + part.count - 1) < 0:
                    log("outbox full while splitting entry %d: kept whole, sent again later" % eid)
                    return TOO_SMALL
                seq += part.count
                part.reset()
                part.add(memoryview(buf)[start:start + k])
            pos = start + k
        if part.count and ob.append(part.payload(), part.count, boot, seq, seq + part.count - 1) < 0:
            log("outbox full while splitting entry %d: kept whole, sent again later" % eid)
            return TOO_SMALL
        ob.ack(eid)
        log("outbox entry %d (%d bytes) exceeded this connection's limit (%d): re-stored in smaller batches"
            % (eid, n, limit))
        return -1

    def _publish(self, eid, resend_pid=0):
        """Publish the batch _load(eid) put in the send buffer (the outbox's entry_*
        fields are still those of eid)."""
        # (no new locals here and in _drain / _on_ack: a larger frame is allocated on the heap
        # per call in MicroPython, which splits the free runs a 64 KB heap needs)
        c = self.client
        if self.mac is not None:       # batch-hmac: P.batch_mac is self.mac.hex
            out = self.out
            self.mac.sign(self.topic, out.count, memoryview(out.buf)[out.headroom:out.end])
        if c.sub is not None:          # e2e acks (mqb_e2e.E2E): batch-seq, P.batch_seq is c.sub.seq
            out = self.outbox
            c.sub.seq.set(out.entry_boot, out.entry_first_seq, out.entry_last_seq)
        pid = c.publish_batch(self.out, self.topic, self.qos[_QOS_PUB], resend_pid=resend_pid)
        if pid == BUSY:
            return False
        if c.sub is not None:
            c.sub.add(eid)
        self.count[_PUBLISHES] += 1
        self.wire_bytes += c.last_size
        for i in range(len(self._eid)):      # QoS 0: pid 0, the slot waits for a PINGRESP (_drain)
            if self._eid[i] < 0 or (pid and self._pid[i] == pid):
                self._eid[i] = eid
                self._pid[i] = pid
                return True
        raise RuntimeError("in-flight table full: client allowed more than receive_max")

    def _resend(self):
        """After a resumed session, publish again (DUP=1, same packet id) what the broker
        had not acknowledged. False while Receive Maximum holds some of them back."""
        c = self.client
        for pid in c.pending_resend():
            i = self._slot(pid)
            eid = self._eid[i] if i >= 0 else -1
            if eid < 0 or self._load(eid) < 0:
                c.abandon(pid)           # its data is gone or was re-stored: nothing to resend
                if i >= 0:
                    self._eid[i] = -1
                continue
            if not self._publish(eid, pid):
                return False
        return True

    def _drain(self, now):
        """Send stored batches, oldest first, while Receive Maximum allows: first the
        resends of a resumed session (the client takes nothing new before them).
        With e2e acks: nothing until the ack subscription is answered, then the
        entries whose e2e ack is overdue, then new ones while the window has room."""
        c = self.client                # c.sub: mqb_e2e.E2E with e2e acks on, else None
        if c.sub is not None and c.sub.code == _SUB_PENDING:
            return                       # SUBACK first: it says whether PUBACK ends the line
        if self._resend_pending:
            if not self._resend():
                return
            self._resend_pending = False
        if time.ticks_diff(now, self.hold_until) < 0:
            return
        qos0 = self.qos[_QOS_PUB] == 0
        if qos0 and self.count[_QOS0_PING]:
            # QoS 0 has no acknowledgement: the batches sent (slots with packet id 0) stay
            # in the outbox until the broker answers the PINGREQ sent after them; then
            # they are removed, counted qos0 (read by the broker, delivery unconfirmed)
            if c.pongs < self.count[_QOS0_PING]:
                return
            self.count[_QOS0_PING] = 0
            for i in range(len(self._eid)):
                eid = self._eid[i]
                if eid >= 0:
                    self._eid[i] = -1
                    if c.sub is not None and c.sub.ack(eid):
                        continue         # read by the broker: now awaits its e2e ack
                    n = self.outbox.records(eid)
                    if self.outbox.ack(eid) == 0:
                        self.count[_QOS0_BATCHES] += 1
                        self.count[_QOS0_RECORDS] += n
        sent = 0
        if c.sub is not None:
            # e2e acks overdue: a new PUBLISH of the same entry (DUP 0), counted
            while c.connected and (self._in_flight(-1) if qos0 else c.inflight < c.limit):
                eid = c.sub.pop(now)
                if eid < 0:
                    break
                if self._load(eid) < 0:
                    c.sub.discard(eid)   # gone, corrupt or re-stored split
                    continue
                if not self._publish(eid):
                    c.sub.ack(eid)       # BUSY: wait again (cannot happen below the limit)
                    break
                c.sub.values[0] += 1     # e2e_resends
                sent += 1
        while c.connected and (self._in_flight(-1) if qos0 else c.inflight < c.limit):
            if c.sub is not None and c.sub.find(-1) < 0:
                break                    # the window is full: new batches wait in the outbox
            if not self.outbox.peek(self._ids, 1, self.cursor):
                break
            eid = self._ids[0]
            if self._in_flight(eid) or c.sub is not None and c.sub.find(eid) >= 0:
                self.cursor = eid
                continue
            if self._load(eid) < 0:
                self.cursor = eid
                continue
            if not self._publish(eid):
                break
            self.cursor = eid
            sent += 1
        if qos0 and sent:
            self.count[_QOS0_PING] = c.ping()

    def _on_ack(self, pid, code, reason):
        i = self._slot(pid)
        if i < 0:
            log("ack for unknown packet id %d (code 0x%02x)" % (pid, code & 0xFF))
            return
        eid = self._eid[i]
        self._eid[i] = -1
        if self.client.sub is not None and (code >= 0x80 or code == SESSION_LOST or
                                            code == _NO_MATCHING_SUBSCRIBERS and self.require_subscribers):
            self.client.sub.discard(eid)    # not delivered: sent again (or discarded) as without e2e acks
        if code == SESSION_LOST:
            self.cursor = -1        # the broker forgot it: send it again
            return
        if code == _NO_MATCHING_SUBSCRIBERS and self.require_subscribers:
            self.count[_UNHEARD] += 1
            self._retry_later()
            if self.count[_UNHEARD] == 1 or self.count[_UNHEARD] % 100 == 0:
                log("PUBACK 0x10 No matching subscribers for batch %d: kept, sent again later (%d so far)"
                    % (eid, self.count[_UNHEARD]))
            return
        if code < 0x80:
            self.backoff_n = 0          # the link carries data: reconnect promptly next time
            self.hold_n = 0
            if self.client.sub is not None and self.client.sub.ack(eid):
                return                  # it stays, awaiting its e2e ack (mqb_e2e)
            n = self.outbox.records(eid)
            if self.outbox.ack(eid) == 0:
                self.count[_ACKED_BATCHES] += 1
                self.count[_ACKED_RECORDS] += n
            return
        self.count[_LAST_ERROR] = code
        self.count[_REFUSED_BATCHES] += 1
        if code in _TRANSIENT:
            self._retry_later()
            log("broker refused batch %d with 0x%02x %s (%s): kept, retried later"
                % (eid, code, P.reason_name(code), reason))
        else:
            n = self.outbox.records(eid)
            self.outbox.discard(eid)
            log("broker refused batch %d with 0x%02x %s (%s): discarded, %d records counted dropped"
                % (eid, code, P.reason_name(code), reason, n))

    def _retry_later(self):
        """Send every pending batch again, from the oldest, after a pause that doubles
        with each refusal in a row (up to backoff.max_ms): a broker that keeps answering
        0x10 or 0x97 is not flooded with resends."""
        self.cursor = -1
        delay = self.backoff_ms << min(self.hold_n, 16)
        self.hold_until = time.ticks_add(time.ticks_ms(), min(delay, self.backoff_max_ms))
        self.hold_n += 1

    def _network(self, now):
        c = self.client
        if not c.connected:
            if time.ticks_diff(now, self.next_connect) >= 0:
                self._connect(now)
            return
        try:
            c.service()
            self._drain(now)
        except (MQTTError, TransportError) as e:
            self._failed(e, now)

    # ---- main loop --------------------------------------------------------------

    def step(self):
        now = time.ticks_ms()
        if self.sampling:
            if self.paused and not self._seal():
                while time.ticks_diff(now, self.next_sample) >= 0:   # no room: samples not taken
                    self.count[_MISSED_SAMPLES] += 1
                    self.next_sample = time.ticks_add(self.next_sample, self.period_ms)
            while time.ticks_diff(now, self.next_sample) >= 0 and not self.paused:
                self._sample()
                self.next_sample = time.ticks_add(self.next_sample, self.period_ms)
            if self.health_ms and time.ticks_diff(now, self.next_health) >= 0 and not self.paused:
                self._health()
                self.next_health = time.ticks_add(self.next_health, self.health_ms)
            if self.enc.count and time.ticks_diff(now, self.batch_started) >= self.max_age_ms:
                self._seal()
        self._network(now)
        used = gc.mem_alloc()
        if used > self.count[_PEAK_HEAP]:
            self.count[_PEAK_HEAP] = used
        # sleep until the next sample is due, waking early for broker data
        wait = time.ticks_diff(self.next_sample, time.ticks_ms()) if self.sampling else 20
        if wait > 0:
            if self.client.connected:
                self.client.transport.wait(min(wait, 50))
            else:
                time.sleep_ms(min(wait, 50))

    def stop_sampling(self):
        """Stop sampling and store the open batch (the run is ending)."""
        if self.sampling:
            if self.health_ms:
                self._health()
            self.sampling = False
            self._seal()

    def idle(self):
        return (not self.sampling and self.outbox.depth == 0 and not self.enc.count
                and self.client.inflight == 0)

    def run(self, run_for_s=None, drain_timeout_s=None):
        run_for_s = self.run_for_s if run_for_s is None else run_for_s
        drain_s = self.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        start = drain_start = time.ticks_ms()
        try:
            while True:
                self.step()
                if run_for_s is not None and self.sampling and \
                        time.ticks_diff(time.ticks_ms(), start) >= run_for_s * 1000:
                    self.stop_sampling()
                    drain_start = time.ticks_ms()
                    log("sampling stopped after %d s; draining the outbox" % run_for_s)
                if not self.sampling:
                    if self.idle() or time.ticks_diff(time.ticks_ms(), drain_start) >= drain_s * 1000:
                        break
        finally:
            self.stop_sampling()
            if self.client.connected:
                try:
                    self.client.disconnect()
                except TransportError as e:
                    log("disconnect: %s" % e)
            self.outbox.close()
            # the summary is the last thing a run allocates: collect first, and let
            # json.dump write it piece by piece (no one string of the whole line)
            gc.collect()
            print("MQB-SUMMARY ", end="")
            from sys import stdout     # not a module global (heap)
            json.dump(self.summary(), stdout)
            print()

    def summary(self):
        c = self.count
        s = {"device": self.device_id, "boot": self.boot, "sampled": c[_SAMPLED],
                "stored_records": c[_STORED_RECORDS], "stored_batches": c[_STORED_BATCHES],
                "acked_records": c[_ACKED_RECORDS], "acked_batches": c[_ACKED_BATCHES],
                "refused_batches": c[_REFUSED_BATCHES], "no_subscribers": c[_UNHEARD], "publishes": c[_PUBLISHES],
                "wire_bytes": self.wire_bytes, "reconnects": c[_RECONNECTS], "last_error": c[_LAST_ERROR],
                "outbox_depth": self.outbox.depth, "outbox_records": self.outbox.pending_records,
                "dropped_total": self.outbox.dropped_total, "missed_samples": c[_MISSED_SAMPLES],
                "peak_heap": c[_PEAK_HEAP], "peak_heap_live": c[_PEAK_HEAP_LIVE], "next_seq": self.writer.seq,
                "qos0_records": c[_QOS0_RECORDS], "qos0_batches": c[_QOS0_BATCHES], "publish_qos": self.qos[_QOS_PUB],
                "will_qos": self.client.will.qos, "will_retain": self.client.will.retain,
                "drained": self.idle()}
        if self.client.sub is not None:
            self.client.sub.summary(s)       # the e2e counters (mqb_e2e)
        return s


def log(msg):
    print("mqb:", msg)


def main(cfg=None, buffers=None, ssl_context=None):
    """Run the application: cfg is the parsed config.json (read here if None);
    buffers and ssl_context as for App (main.py)."""
    app = App(make_config(cfg) if cfg is not None else load_config(), buffers=buffers, ssl_context=ssl_context)
    app.run()
    if not app.idle():
        # a finite run (run_for_s) ended with batches not delivered: say so in the exit status
        raise SystemExit(1)
