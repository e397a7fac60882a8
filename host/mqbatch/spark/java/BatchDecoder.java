package mqbatch.jvm;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF5;
import org.apache.spark.unsafe.types.UTF8String;
import org.apache.spark.util.LongAccumulator;

/**
 * The JVM fast path of the Spark job's decoder (docs/spark.md, "JVM fast path").
 *
 * One landed PUBLISH in (topic, payload, user properties, received_at in microseconds,
 * the job's options), its valid telemetry records out, decoded inside the executor's
 * JVM: no Python worker, no Arrow exchange. It accepts a PUBLISH only when the
 * reference decoder (mqbatch.codec.decode + mqbatch.records.parse, mqbatch.spark.decoder)
 * would deliver it whole: batch status ok, a telemetry topic with a valid device id,
 * and every sub-message a valid binary v1 record. Anything else - a malformed batch,
 * a bad topic, a JSON record, a bad record, a property that json.dumps would escape,
 * a null column - is "not fast" and the job decodes that PUBLISH with the Python
 * decoders, which name the reason. So this class never decides a reason code; it
 * only recognises the valid case, and the differential tests hold it to the reference.
 *
 * Options string: "max_batch_size,max_payload_bytes,allow_empty(0|1),max_future_ms".
 * Result (BatchDecoder): struct(fast, batch_id, device, count, records) where records is
 * array<struct<boot, seq, kind, synced, time_us, start, length, readings, dropped_total>>
 * (start and length: the record's bytes in the payload) (null when not
 * fast). IsFast returns the "fast" flag alone, without building any record.
 */
public final class BatchDecoder implements UDF5<String, byte[], scala.collection.Seq<Row>, Long, String, Row> {
    private static final long serialVersionUID = 1L;

    // -- records.py: channels, kinds, layout ------------------------------------------
    static final int HEADER = 18, READING = 5, MAX_READINGS = 32;
    static final long EPOCH_2020_S = 1_577_836_800L;
    static final int DROPPED_TOTAL = 0x82;
    // channel names and kinds as Spark's own strings: returned as they are, never re-encoded per record
    static final UTF8String[] NAME = new UTF8String[256];
    static final byte[] KIND = new byte[256];          // 0 unknown, 1 sample, 2 health
    static final long[] LOW = new long[256], HIGH = new long[256];
    static final double[] DIVISOR = new double[256];
    static final UTF8String[] KINDS = {null, UTF8String.fromString("sample"), UTF8String.fromString("health")};

    private static void channel(int id, String name, int kind, long low, long high, int divisor) {
        NAME[id] = UTF8String.fromString(name); KIND[id] = (byte) kind; LOW[id] = low; HIGH[id] = high; DIVISOR[id] = divisor;
    }

    static {
        long min = Long.MIN_VALUE, max = Long.MAX_VALUE;
        channel(1, "temperature", 1, -5000, 15000, 100);
        channel(2, "humidity", 1, 0, 10000, 100);
        channel(3, "supply_voltage", 1, 0, 20000, 1000);
        channel(4, "rssi", 1, -127, 0, 1);
        channel(5, "pressure", 1, 30000, 120000, 1);
        channel(6, "light", 1, 0, 200000, 1);
        channel(0x80, "free_heap", 2, 0, max, 1);
        channel(0x81, "outbox_depth", 2, 0, max, 1);
        channel(0x82, "dropped_total", 2, 0, max, 1);
        channel(0x83, "reconnects", 2, 0, max, 1);
        channel(0x84, "last_error", 2, min, max, 1);
        channel(0x85, "sampled_total", 2, 0, max, 1);
        channel(0x86, "outbox_bytes", 2, 0, max, 1);
    }

    // -- options ---------------------------------------------------------------------
    static final class Options {
        final String text;
        final long maxBatchSize, maxPayloadBytes, maxFutureMs;
        final boolean allowEmpty;

        Options(String text) {
            String[] f = text.split(",");
            if (f.length != 4) throw new IllegalArgumentException("mqbatch BatchDecoder options: " + text);
            this.text = text;
            maxBatchSize = Long.parseLong(f[0]);
            maxPayloadBytes = Long.parseLong(f[1]);
            allowEmpty = f[2].equals("1");
            maxFutureMs = Long.parseLong(f[3]);
        }
    }

    private transient Options options;
    /** Counts the landed rows this UDF does not take (decode_to's second part runs only when
     * it is not 0); null when Spark made the instance (registerJavaFunction). */
    private final LongAccumulator notFast;

    public BatchDecoder() {
        this(null);
    }

    public BatchDecoder(LongAccumulator notFast) {
        this.notFast = notFast;
    }

    Options options(String text) {
        Options o = options;
        if (o == null || !o.text.equals(text)) options = o = new Options(text);
        return o;
    }

    // -- the checks ------------------------------------------------------------------
    /** Sub-message bounds of a batch whose structure the reference decodes as ok, or null. */
    static int[] split(byte[] p, int expected, Options o) {
        int[] bounds = new int[2 * expected];
        int pos = 0, k = 0, len = p.length;
        while (pos < len && k < expected) {
            int n = 0, i = 0, b;
            while (true) {                                  // VBI: minimal, at most 4 bytes
                if (pos + i >= len || i == 4) return null;
                b = p[pos + i] & 0xff;
                n |= (b & 0x7f) << (7 * i);
                if ((b & 0x80) == 0) break;
                i++;
            }
            if (i > 0 && b == 0) return null;
            int start = pos + i + 1;
            if (n == 0 && !o.allowEmpty) return null;
            if (n > len - start) return null;
            bounds[2 * k] = start;
            bounds[2 * k + 1] = n;
            k++;
            pos = start + n;
        }
        return (k == expected && pos == len) ? bounds : null;
    }

    /** The batch-size of properties the reference accepts (one batch-format "v1", one
     * batch-size within the limit, every key and value copied verbatim by json.dumps), else -1. */
    static int expectedCount(scala.collection.Seq<Row> props, Options o) {
        if (props == null) return -1;
        String format = null, size = null;
        int nFormat = 0, nSize = 0;
        for (int i = 0, n = props.length(); i < n; i++) {
            Row r = props.apply(i);
            if (r == null || r.isNullAt(0) || r.isNullAt(1)) return -1;
            String k = r.getString(0), v = r.getString(1);
            if (!jsonVerbatim(k) || !jsonVerbatim(v)) return -1;
            if (k.equals("batch-format")) { format = v; nFormat++; }
            else if (k.equals("batch-size")) { size = v; nSize++; }
        }
        if (nFormat != 1 || nSize != 1 || !format.equals("v1")) return -1;
        int len = size.length();
        if (len == 0 || len > 9 || size.charAt(0) == '0') return -1;
        for (int i = 0; i < len; i++) {
            char c = size.charAt(i);
            if (c < '0' || c > '9') return -1;
        }
        int expected = Integer.parseInt(size);
        return expected <= o.maxBatchSize ? expected : -1;
    }

    /** Printable ASCII without '"' and '\': json.dumps copies it unchanged. */
    static boolean jsonVerbatim(String s) {
        for (int i = 0, n = s.length(); i < n; i++) {
            char c = s.charAt(i);
            if (c < 0x20 || c > 0x7f || c == '"' || c == '\\') return false;
        }
        return true;
    }

    /** The device id of mqbatch/<1..64 of A-Z a-z 0-9 _ . -></>/telemetry, else null. */
    static String device(String topic) {
        if (topic == null || !topic.startsWith("mqbatch/") || !topic.endsWith("/telemetry")) return null;
        int end = topic.length() - "/telemetry".length();
        if (end - 8 < 1 || end - 8 > 64) return null;
        for (int i = 8; i < end; i++) {
            char c = topic.charAt(i);
            if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
                  || c == '_' || c == '.' || c == '-')) return null;
        }
        return topic.substring(8, end);
    }

    static long u32(byte[] p, int o) {
        return (p[o] & 0xffL) | (p[o + 1] & 0xffL) << 8 | (p[o + 2] & 0xffL) << 16 | (p[o + 3] & 0xffL) << 24;
    }

    static int i32(byte[] p, int o) {
        return (p[o] & 0xff) | (p[o + 1] & 0xff) << 8 | (p[o + 2] & 0xff) << 16 | p[o + 3] << 24;
    }

    /** Whether the sub-message at s (n bytes) is a binary v1 record records.parse accepts. */
    static boolean validRecord(byte[] p, int s, int n, long receivedMs, Options o) {
        if (n < HEADER || p[s] != 1) return false;
        int kind = p[s + 1] & 0xff, flags = p[s + 2] & 0xff, count = p[s + 3] & 0xff;
        if (kind != 1 && kind != 2) return false;
        if ((flags & 0xfe) != 0 || count > MAX_READINGS || n != HEADER + READING * count) return false;
        int timeMs = (p[s + 16] & 0xff) | (p[s + 17] & 0xff) << 8;
        if (timeMs > 999) return false;
        long seen = 0L;                                      // channel ids < 7 or 0x80..0x86: one bit each
        for (int i = 0; i < count; i++) {
            int at = s + HEADER + READING * i, ch = p[at] & 0xff;
            if (KIND[ch] != kind) return false;              // unknown channel or kind mismatch
            long bit = 1L << (ch < 0x80 ? ch : ch - 0x80 + 8);
            if ((seen & bit) != 0) return false;             // duplicate channel
            seen |= bit;
        }
        for (int i = 0; i < count; i++) {
            int at = s + HEADER + READING * i, ch = p[at] & 0xff;
            long v = i32(p, at + 1);
            if (v < LOW[ch] || v > HIGH[ch]) return false;
        }
        long deviceMs = (EPOCH_2020_S + u32(p, s + 12)) * 1000 + timeMs;
        return deviceMs - receivedMs <= o.maxFutureMs;
    }

    /** The sub-message bounds when the whole PUBLISH takes the fast path, else null. */
    static int[] fastBounds(String topic, byte[] payload, scala.collection.Seq<Row> props, Long receivedUs,
                            Options o) {
        if (payload == null || receivedUs == null || device(topic) == null) return null;
        int expected = expectedCount(props, o);
        // a sub-message takes at least its 1-byte length prefix: more than that many cannot be "ok"
        // (and the bounds array stays within the payload's size, whatever batch-size says)
        if (expected < 0 || expected > payload.length || payload.length > o.maxPayloadBytes) return null;
        int[] bounds = split(payload, expected, o);
        if (bounds == null) return null;
        long receivedMs = Math.floorDiv(receivedUs, 1000L);
        for (int k = 0; k < expected; k++)
            if (!validRecord(payload, bounds[2 * k], bounds[2 * k + 1], receivedMs, o)) return null;
        return bounds;
    }

    // -- the outputs -----------------------------------------------------------------
    private static final ThreadLocal<MessageDigest> SHA256 = ThreadLocal.withInitial(() -> {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    });
    private static final char[] HEX = "0123456789abcdef".toCharArray();

    /** mqbatch.spark.decoder._batch_id: sha-256 of topic, 0, json.dumps(properties), 0, payload;
     * 32 hex digits. Only called for topics and properties of printable ASCII (fastBounds). */
    static String batchId(String topic, scala.collection.Seq<Row> props, byte[] payload) {
        StringBuilder json = new StringBuilder(64).append('[');
        for (int i = 0, n = props.length(); i < n; i++) {
            Row r = props.apply(i);
            if (i > 0) json.append(", ");
            json.append("[\"").append(r.getString(0)).append("\", \"").append(r.getString(1)).append("\"]");
        }
        json.append(']');
        MessageDigest sha = SHA256.get();
        sha.reset();
        sha.update(topic.getBytes(StandardCharsets.US_ASCII));
        sha.update((byte) 0);
        sha.update(json.toString().getBytes(StandardCharsets.US_ASCII));
        sha.update((byte) 0);
        sha.update(payload);
        byte[] d = sha.digest();
        char[] out = new char[32];
        for (int i = 0; i < 16; i++) {
            out[2 * i] = HEX[(d[i] >> 4) & 0xf];
            out[2 * i + 1] = HEX[d[i] & 0xf];
        }
        return new String(out);
    }

    static Row record(byte[] p, int s, int n) {
        int count = p[s + 3] & 0xff;
        Object[] readings = new Object[count];
        Long dropped = null;
        for (int i = 0; i < count; i++) {
            int at = s + HEADER + READING * i, ch = p[at] & 0xff;
            long v = i32(p, at + 1);
            readings[i] = RowFactory.create(ch, NAME[ch], v, v / DIVISOR[ch]);
            if (ch == DROPPED_TOTAL && dropped == null) dropped = v;
        }
        long timeMs = (EPOCH_2020_S + u32(p, s + 12)) * 1000 + ((p[s + 16] & 0xff) | (p[s + 17] & 0xff) << 8);
        return RowFactory.create(u32(p, s + 4), u32(p, s + 8), KINDS[p[s + 1]], (p[s + 2] & 1) == 1,
                                 timeMs * 1000, s, n, readings, dropped);
    }

    private static final Row NOT_FAST = RowFactory.create(false, null, null, null, null);

    /** fastBounds, with any exception (a bug here) meaning "not fast": the Python decoders then
     * take the row. Both UDFs decide through this one method, so they always agree. */
    static int[] fastBoundsOrNull(String topic, byte[] payload, scala.collection.Seq<Row> props, Long receivedUs,
                                  Options o) {
        try {
            return fastBounds(topic, payload, props, receivedUs, o);
        } catch (RuntimeException e) {
            return null;
        }
    }

    @Override
    public Row call(String topic, byte[] payload, scala.collection.Seq<Row> props, Long receivedUs,
                    String optionsText) {
        int[] bounds = fastBoundsOrNull(topic, payload, props, receivedUs, options(optionsText));
        if (bounds == null) {
            if (notFast != null) notFast.add(1);
            return NOT_FAST;
        }
        // from here on an exception fails the task (loudly): IsFast has said this row is ours
        int n = bounds.length / 2;
        Object[] recs = new Object[n];
        for (int k = 0; k < n; k++) recs[k] = record(payload, bounds[2 * k], bounds[2 * k + 1]);
        return RowFactory.create(true, batchId(topic, props, payload), device(topic), n, recs);
    }

    /** The "fast" flag alone: which landed rows the Python decoders must take. */
    public static final class IsFast implements UDF5<String, byte[], scala.collection.Seq<Row>, Long, String, Boolean> {
        private static final long serialVersionUID = 1L;
        private transient BatchDecoder holder;

        @Override
        public Boolean call(String topic, byte[] payload, scala.collection.Seq<Row> props, Long receivedUs,
                            String optionsText) {
            if (holder == null) holder = new BatchDecoder();
            return fastBoundsOrNull(topic, payload, props, receivedUs, holder.options(optionsText)) != null;
        }
    }
}
