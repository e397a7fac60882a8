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
# See docs/application.md.#
# The App is in four modules, each one job (tests/test_firmware_layout.py):
# mqb_config (configuration), mqb_flush (sampling and flush), mqb_net (the
# network session), this one (the state, the main loop); e2e acks are mqb_e2e's.
import gc
import time
from array import array

import mqb_board as board
import mqb_packet_build as B
import mqb_record as R
from mqb_boot import BootCounter
from mqb_client import Client
from mqb_codec import BatchEncoder
import mqb_flush as F
from mqb_net import Session
from mqb_outbox import Outbox
from mqb_transport import TransportError

# RAM: every public global of a module costs heap on a board even when its code
# runs from flash (a dict entry, its name); constants are private const() values
# (folded into the bytecode; mqb_flush and mqb_net have their own copies of those
# they use; tests/test_firmware_layout.py checks that the copies agree), and an
# App keeps the config values it uses, not the config dict.

# Broker refusals worth retrying later (mqb_net: the batch stays in the outbox); any other
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
# reconnects 0x83, last_error 0x84, sampled_total 0x85, outbox_bytes 0x86, released_unconfirmed 0x87
_HEALTH_CHANNELS = const(b"\x80\x81\x82\x83\x84\x85\x86\x87")

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
_PEAK_HEAP = const(12)         # highest gc.mem_alloc() after a step's network work (live objects + garbage)
_PEAK_HEAP_LIVE = const(13)    # highest gc.mem_alloc() right after a gc.collect() (_measure_live)
_QOS0_BATCHES = const(14)      # sent at QoS 0 and read by the broker (PINGRESP after them): no delivery ack
_QOS0_RECORDS = const(15)
_QOS0_PING = const(16)         # QoS 0: number of the PINGREQ whose PINGRESP confirms the batches sent (0: none)
_TOO_LARGE = const(17)         # records refused: larger than any batch the broker's Maximum Packet Size allows
_REFUSED_AT = const(18)        # the batch payload limit at which a too-large record was last logged
_N_COUNTS = const(19)

# Indexes of App.qos
_QOS_CFG = const(0)
_QOS_PUB = const(1)
_QOS_MIN = const(2)

# Indexes of App.ms (durations, ms) and App.at (times, ticks_ms)
_AT_SAMPLE = const(0)
_AT_HEALTH = const(1)
_AT_BATCH = const(2)
_AT_CONNECT = const(3)
_AT_HOLD = const(4)
_AT_CONNECTED = const(5)
_AT_NET = const(6)             # the network work is due by then even without a trigger (step)
_MS_PERIOD = const(0)
_MS_HEALTH = const(1)
_MS_MAX_AGE = const(2)
_MS_BACKOFF = const(3)
_MS_BACKOFF_MAX = const(4)
_N_AT = const(7)
_NET_EVERY_MS = const(20)    # the network work's period without a trigger (step)


class App(Session, F.Sampling):
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
        headroom = 64 + len(self.topic)
        max_bytes = fl["max_bytes"]
        self.mac = None
        extra = 0
        if cfg["hmac_key"] is not None:     # hex, checked by make_config (mqb_config.hmac_key)
            # every batch PUBLISH carries batch-hmac (docs/format.md): 79 more header bytes
            from binascii import unhexlify
            from mqb_hmac import BatchMac   # imported only when used: a module costs heap on a board
            self.mac = BatchMac(unhexlify(cfg["hmac_key"]))
            extra = B.BATCH_MAC_PROPERTY_LEN
        e2e = cfg.get("e2e_ack")
        if e2e is not None:
            extra += _BATCH_SEQ_ROOM        # the batch-seq property at its largest (docs/e2e-ack.md)
        headroom += extra
        if extra and buffers is not None and min(len(b) for b in buffers) - headroom < max_bytes:
            max_bytes = min(len(b) for b in buffers) - headroom
            F.log("flush.max_bytes %d lowered to %d: the batch-hmac / batch-seq properties take %d bytes of the "
                "batch buffers" % (fl["max_bytes"], max_bytes, extra))
        B.batch_mac = self.mac.hex if self.mac is not None else None
        # two buffers: one fills with samples while the other sends a stored batch
        need = headroom + max_bytes
        if buffers is None:
            buffers = (bytearray(need), bytearray(need))
        for b in buffers:
            if len(b) < need:
                raise ValueError("batch buffer of %d bytes < %d needed (flush.max_bytes %d + %d header room)"
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
            raise ValueError("outbox.segment_bytes %d holds batches of up to %d bytes, less than flush.max_bytes %d"
                              % (ob["segment_bytes"], self.outbox.max_payload, max_bytes))
        self.writer = R.RecordWriter(self.enc, self.clock, self.boot, cfg["record_format"], self._renew_boot)
        self.channels = bytes(board.CHANNELS)
        self.values = array("i", bytes(4 * len(self.channels)))
        self.health_values = array("i", bytes(4 * len(_HEALTH_CHANNELS)))
        self.record_size = R.HEADER_SIZE + R.READING_SIZE * len(self.channels)
        # the config values used after start-up (the config dict itself is not kept)
        self.net_cfg = {"wifi": cfg["wifi"]} if "wifi" in cfg else {}    # board.network_connect()
        bo = cfg["backoff"]
        # the schedule: durations (ms) and times (ticks_ms), two arrays indexed by the _MS_* and
        # _AT_* constants, not eleven attributes: the instance dict stays at 37 slots (592 bytes;
        # one more attribute and it grows to a 752-byte block, which a 64 KB heap may not have
        # in one run after the imports)
        self.ms = array("i", (max(1, int(1000 / cfg["sample_hz"])), int(cfg["health_every_s"] * 1000),
                              fl["max_age_ms"], bo["initial_ms"], bo["max_ms"]))
        self.at = array("i", bytes(4 * _N_AT))
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
        for i in range(_N_AT):
            self.at[i] = now
        self.batch_first_seq = 0
        self.batch_reported = -1
        self.backoff_n = 0
        self.hold_n = 0            # refusals (0x10, transient codes) in a row
        self._resend_pending = False
        self.cursor = -1           # highest outbox id sent on this connection
        self.sampling = True
        self.paused = False        # outbox full with policy "stop"
        # counters (health records and the final summary): one array, indexed by the
        # _SAMPLED.. constants above (an attribute each would cost a dict slot each)
        self.count = array("i", bytes(4 * _N_COUNTS))
        self.wire_bytes = 0        # may pass 2**31 on a long run: not in the int32 array
        B.batch_seq = None
        if e2e is not None:
            import mqb_e2e                  # imported only when used: a module costs heap on a board
            # the E2E registers itself as self.client.sub: the App keeps no attribute for it
            # (one more can grow the instance dict by ~1 KB in a 64 KB heap)
            B.batch_seq = mqb_e2e.init(self.client, self.topic, e2e, self.outbox, self.count, F.log).seq
        F.log("boot %d, device %s, outbox %d entries (%d records) pending" % (
            self.boot, dev, self.outbox.depth, self.outbox.pending_records))
        if "mqb_native" not in __import__("sys").modules:   # no machine code here, or it failed to load
            F.log("mqb_native not loaded (this port runs no machine code, or its .mpy is for another arch or "
                  "version): CRC-32 and records in Python, ~250x and ~9x slower")
        for reason, first, end, n in self.outbox.damage:   # flash rot found on open (docs/outbox.md)
            if n < 0:
                F.log("outbox segment %08x unreadable (%s): its entries are lost, not counted" % (first, reason))
            else:
                F.log("outbox entries %d..%d lost on flash (%s): %d records counted dropped" % (first, end - 1, reason, n))

    def _make_client(self, cfg, ssl_context):
        from mqb_transport import Transport
        b = cfg["broker"]
        transport = Transport(b["host"], b["port"], cafile=b["ca"] if b["tls"] else None,
                                   certfile=b["client_cert"], keyfile=b["client_key"],
                                   server_hostname=b["server_hostname"], plain_tcp=not b["tls"],
                                   timeout_ms=b["connect_timeout_ms"], ssl_context=ssl_context)
        status = cfg["status_topic"].format(device_id=cfg["device_id"])
        will = B.Will(status, b"offline", qos=1, retain=True)
        return Client(transport, cfg["device_id"], b["username"], b["password"], b["keepalive_s"],
                      b["session_expiry_s"], b["receive_max"], will=will, on_ack=self._on_ack,
                      timeout_ms=b["connect_timeout_ms"])

    def _renew_boot(self):
        self.boot = BootCounter(self.flash + "/mqb_boot").next()
        self.outbox.rebase()
        return self.boot

    # ---- main loop --------------------------------------------------------------

    def step(self):
        now = time.ticks_ms()
        sealed = self.count[_STORED_BATCHES]
        if self.sampling:
            if self.paused and not self._seal():
                while time.ticks_diff(now, self.at[_AT_SAMPLE]) >= 0:   # no room: samples not taken
                    self.count[_MISSED_SAMPLES] += 1
                    self.at[_AT_SAMPLE] = time.ticks_add(self.at[_AT_SAMPLE], self.ms[_MS_PERIOD])
            while time.ticks_diff(now, self.at[_AT_SAMPLE]) >= 0 and not self.paused:
                self._sample()
                self.at[_AT_SAMPLE] = time.ticks_add(self.at[_AT_SAMPLE], self.ms[_MS_PERIOD])
            if self.ms[_MS_HEALTH] and time.ticks_diff(now, self.at[_AT_HEALTH]) >= 0 and not self.paused:
                self._health()
                self.at[_AT_HEALTH] = time.ticks_add(self.at[_AT_HEALTH], self.ms[_MS_HEALTH])
            if self.enc.count and time.ticks_diff(now, self.at[_AT_BATCH]) >= self.ms[_MS_MAX_AGE]:
                self._seal()
        # The network work (read what the broker sent, send stored batches) when it has
        # something to do: data arrived (the wait below), a batch was stored, not connected;
        # else every _NET_EVERY_MS (keep-alive, resend and hold timers: seconds). So is the
        # peak heap's reading: gc.mem_alloc() walks the heap's allocation table (16 us in a
        # 96 KB heap on the host). Both ran on every step before: at 1,000 samples/s, 115 us
        # of CPU per record (docs/application.md, "CPU").
        if (sealed != self.count[_STORED_BATCHES] or not self.client.connected
                or time.ticks_diff(now, self.at[_AT_NET]) >= 0):
            self.at[_AT_NET] = time.ticks_add(now, _NET_EVERY_MS)
            self._network(now)
            used = gc.mem_alloc()
            if used > self.count[_PEAK_HEAP]:
                self.count[_PEAK_HEAP] = used
        # sleep until the next sample is due, waking early for broker data
        wait = time.ticks_diff(self.at[_AT_SAMPLE], time.ticks_ms()) if self.sampling else 20
        if wait > 0:
            if self.client.connected:
                if self.client.transport.wait(min(wait, 50)):
                    self.at[_AT_NET] = time.ticks_ms()     # data to read: the next step reads it
            else:
                time.sleep_ms(min(wait, 50))

    def stop_sampling(self):
        """Stop sampling and store the open batch (the run is ending)."""
        if self.sampling:
            if self.ms[_MS_HEALTH]:
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
                    F.log("sampling stopped after %d s; draining the outbox" % run_for_s)
                if not self.sampling:
                    if self.idle() or time.ticks_diff(time.ticks_ms(), drain_start) >= drain_s * 1000:
                        break
        finally:
            self.stop_sampling()
            if self.client.connected:
                try:
                    self.client.disconnect()
                except TransportError as e:
                    F.log("disconnect: %s" % e)
            self.outbox.close()
            # the summary is the last thing a run allocates: collect first, and let
            # json.dump write it piece by piece (no one string of the whole line)
            gc.collect()
            print("MQB-SUMMARY ", end="")
            from json import dump      # not module globals (heap)
            from sys import stdout
            dump(self.summary(), stdout)
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
                "qos0_records": c[_QOS0_RECORDS], "too_large": c[_TOO_LARGE], "qos0_batches": c[_QOS0_BATCHES], "publish_qos": self.qos[_QOS_PUB],
                "will_qos": self.client.will.qos, "will_retain": self.client.will.retain,
                "drained": self.idle()}
        if self.client.sub is not None:
            self.client.sub.summary(s)       # the e2e counters (mqb_e2e)
        return s


def main(cfg=None, buffers=None, ssl_context=None):
    """Run the application: cfg is the parsed config.json (read here if None);
    buffers and ssl_context as for App (main.py)."""
    import sys
    import mqb_config
    cfg = mqb_config.make_config(cfg) if cfg is not None else mqb_config.load_config()
    # start-up only: unloaded before App() allocates (its ~2 KB are then free for App)
    del mqb_config
    sys.modules.pop("mqb_config", None)
    app = App(cfg, buffers=buffers, ssl_context=ssl_context)
    del cfg          # App() keeps the values it uses: the config dict may not stay (~1 KB)
    app.run()
    if not app.idle():
        # a finite run (run_for_s) ended with batches not delivered: say so in the exit status
        raise SystemExit(1)
