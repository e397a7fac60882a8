package mqbatch.jvm;

import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HashMap;
import java.util.Map;

import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.catalyst.expressions.objects.Invoke;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.types.AbstractDataType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.ObjectType;
import org.apache.spark.unsafe.types.UTF8String;
import org.apache.spark.util.LongAccumulator;

/**
 * The JVM fast path of the Spark job's decoder (docs/spark.md, "JVM fast path").
 *
 * One landed PUBLISH in (topic, payload, user properties, received_at in microseconds and
 * whether it is null), its valid telemetry records out, decoded inside the executor's
 * JVM: no Python worker, no Arrow exchange. It accepts a PUBLISH only when the
 * reference decoder (mqbatch.codec.decode + mqbatch.records.parse, mqbatch.spark.decoder)
 * would deliver it whole: batch status ok, a telemetry topic with a valid device id,
 * and every sub-message a valid binary v1 record. Anything else - a malformed batch,
 * a bad topic, a JSON record, a bad record, a property that json.dumps would escape,
 * a null column - is "not fast" and the job decodes that PUBLISH with the Python
 * decoders, which name the reason. So this class never decides a reason code; it
 * only recognises the valid case, and the differential tests hold it to the reference.
 *
 * It reaches SQL as two functions of the session (register): an Invoke of decode or
 * isFast on one instance, which holds the job's options. Spark's generated code calls
 * them with its own values (UTF8String, byte[], ArrayData, long) and takes the result
 * as Spark's own rows: nothing is converted on the way in or out.
 *
 * Options: "max_batch_size,max_payload_bytes,allow_empty(0|1),max_future_ms". Keys (the job's
 * --hmac-keys, or null: no check): "device:hexkey,..."; with keys a PUBLISH is fast only if it
 * also passes mqbatch.spark.batch_hmac.check (its device has a key; exactly one batch-hmac
 * property of 64 lowercase hex digits, the HMAC-SHA256 of mqbatch.wire.integrity.message under
 * that key). Any failure is "not fast": the Python decoders name it. The keys never appear in
 * toString (Spark prints it in plans).
 * decode returns struct(fast, batch_id, device, count, records) where records is
 * array<struct<boot, seq, kind, synced, time_us, start, length, readings, dropped_total>>
 * (start and length: the record's bytes in the payload; all but fast null when not
 * fast). isFast returns the "fast" flag alone, without building any record.
 */
public final class BatchDecoder implements Serializable {
    private static final long serialVersionUID = 4L;

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
        channel(0x87, "released_unconfirmed", 2, 0, max, 1);
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

    private final String optionsText;
    /** Counts the landed rows decode does not take (decode_to's second part runs only when
     * it is not 0), or null. */
    private final LongAccumulator notFast;
    private transient volatile Options options;
    /** The keys text, shared: a Spark broadcast (null: no batch-hmac check). In the decoder
     * itself, the text (about 75 bytes a device) went into every stage's task binary: 2 MB
     * with 10,000 devices, five times a micro-batch. */
    private final Broadcast<String> keysShared;
    private transient volatile Map<String, byte[]> keys;
    /** The keys text last parsed in this JVM and its map: every task's copy of the decoder
     * shares them (compared by content: a broadcast's id is reused by a later SparkContext). */
    private static volatile Object[] lastKeys;

    public BatchDecoder(String optionsText, LongAccumulator notFast) {
        this(optionsText, notFast, null);
    }

    public BatchDecoder(String optionsText, LongAccumulator notFast, Broadcast<String> keys) {
        this.options = new Options(optionsText);          // a bad options text fails here, on the driver
        this.optionsText = optionsText;
        this.notFast = notFast;
        this.keysShared = keys;
        this.keys = keys == null ? null : parsedKeys(keys.value());   // and so does a bad keys text
    }

    static Map<String, byte[]> parseKeys(String text) {
        if (text == null) return null;
        Map<String, byte[]> m = new HashMap<>();
        for (String pair : text.isEmpty() ? new String[0] : text.split(",")) {
            int colon = pair.indexOf(':');
            String hex = pair.substring(colon + 1);
            boolean ok = colon >= 1 && hex.length() % 2 == 0;
            for (int i = 0; ok && i < hex.length(); i++) {
                char c = hex.charAt(i);
                ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
            }
            if (!ok) throw new IllegalArgumentException("mqbatch BatchDecoder: bad keys text");   // nothing of it said
            byte[] key = new byte[hex.length() / 2];
            for (int i = 0; i < key.length; i++)
                key[i] = (byte) (Character.digit(hex.charAt(2 * i), 16) << 4 | Character.digit(hex.charAt(2 * i + 1), 16));
            m.put(pair.substring(0, colon), key);
        }
        return m;
    }

    @SuppressWarnings("unchecked")
    private static Map<String, byte[]> parsedKeys(String text) {
        Object[] last = lastKeys;
        if (last != null && last[0].equals(text)) return (Map<String, byte[]>) last[1];
        Map<String, byte[]> m = parseKeys(text);
        lastKeys = new Object[]{text, m};
        return m;
    }

    Map<String, byte[]> keys() {
        Map<String, byte[]> k = keys;
        if (k == null && keysShared != null) keys = k = parsedKeys(keysShared.value());   // after deserialisation
        return k;
    }

    Options options() {
        Options o = options;
        if (o == null) options = o = new Options(optionsText);   // after deserialisation on an executor
        return o;
    }

    @Override
    public String toString() {
        return "mqbatch.BatchDecoder(" + optionsText + (notFast != null ? ", counting" : "")
               + (keysShared != null ? ", batch-hmac" : "") + ")";
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

    /** The user properties as key, value, key, value, ...; null when a property, key or value is null. */
    static String[] properties(ArrayData props) {
        if (props == null) return null;
        int n = props.numElements();
        String[] kv = new String[2 * n];
        for (int i = 0; i < n; i++) {
            if (props.isNullAt(i)) return null;
            InternalRow r = props.getStruct(i, 2);
            if (r.isNullAt(0) || r.isNullAt(1)) return null;
            kv[2 * i] = r.getUTF8String(0).toString();
            kv[2 * i + 1] = r.getUTF8String(1).toString();
        }
        return kv;
    }

    /** The batch-size of properties the reference accepts (one batch-format "v1", one
     * batch-size within the limit, every key and value copied verbatim by json.dumps), else -1. */
    static int expectedCount(String[] kv, Options o) {
        if (kv == null) return -1;
        String format = null, size = null;
        int nFormat = 0, nSize = 0;
        for (int i = 0; i < kv.length; i += 2) {
            String k = kv[i], v = kv[i + 1];
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

    /** The device id of mqbatch/<id>/telemetry, else null: 1..64 of a-z 0-9 _ . -, the first a
     * letter or digit (mqbatch.wire.device_id.DEVICE_ID_PATTERN, the rule of `fleet add`). */
    static String device(String topic) {
        if (topic == null || !topic.startsWith("mqbatch/") || !topic.endsWith("/telemetry")) return null;
        int end = topic.length() - "/telemetry".length();
        if (end - 8 < 1 || end - 8 > 64) return null;
        for (int i = 8; i < end; i++) {
            char c = topic.charAt(i);
            boolean alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
            if (!(alnum || (i > 8 && (c == '_' || c == '.' || c == '-')))) return null;
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
        long seen = 0L;                                      // channel ids < 7 or 0x80..0x87: one bit each
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

    private static final ThreadLocal<Mac> HMAC = ThreadLocal.withInitial(() -> {
        try {
            return Mac.getInstance("HmacSHA256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    });
    static final byte[] LABEL = "MQH1".getBytes(StandardCharsets.US_ASCII);
    static final int KEY_MIN = 16, KEY_MAX = 64;              // integrity.KEY_MIN, KEY_MAX

    /** integrity.mac_hex: the batch-hmac of a batch (64 lowercase hex digits, ASCII) under key,
     * over integrity.message (LABEL, u16-length topic, batch-format and batch-size, u32-length
     * payload); null when a field is longer than 65535 bytes or the key is refused. Public for
     * the test that runs the shared vectors (tests/vectors/batch_hmac_v1.json) through it. */
    public static byte[] macHex(byte[] key, String topic, String format, String size, byte[] payload) {
        byte[] t = topic.getBytes(StandardCharsets.UTF_8), f = format.getBytes(StandardCharsets.UTF_8),
               z = size.getBytes(StandardCharsets.UTF_8);
        if (t.length > 0xFFFF || f.length > 0xFFFF || z.length > 0xFFFF) return null;
        Mac h = HMAC.get();
        try {
            h.init(new SecretKeySpec(key, "HmacSHA256"));
        } catch (GeneralSecurityException | IllegalArgumentException e) {
            return null;
        }
        h.update(LABEL);
        for (byte[] field : new byte[][]{t, f, z}) {
            h.update((byte) (field.length >> 8));
            h.update((byte) field.length);
            h.update(field);
        }
        int n = payload.length;
        h.update(new byte[]{(byte) (n >>> 24), (byte) (n >>> 16), (byte) (n >>> 8), (byte) n});
        h.update(payload);
        return hex(h.doFinal(), 32);
    }

    /** Whether the batch passes batch_hmac.check under `keys` (see the class comment). Called
     * only for properties expectedCount accepted: one batch-format, one batch-size, all ASCII. */
    static boolean signed(String topic, String device, String[] props, byte[] payload, Map<String, byte[]> keys) {
        byte[] key = keys.get(device);
        if (key == null || key.length < KEY_MIN || key.length > KEY_MAX) return false;   // integrity.mac_hex refuses them
        String mac = null, format = null, size = null;
        for (int i = 0; i < props.length; i += 2) {
            if (props[i].equals("batch-hmac")) {
                if (mac != null) return false;              // repeated
                mac = props[i + 1];
            } else if (props[i].equals("batch-format") && format == null) format = props[i + 1];   // the first, as
            else if (props[i].equals("batch-size") && size == null) size = props[i + 1];        // integrity.message
        }
        if (mac == null || mac.length() != 64) return false;
        byte[] got = mac.getBytes(StandardCharsets.US_ASCII);
        for (byte b : got) if (!((b >= '0' && b <= '9') || (b >= 'a' && b <= 'f'))) return false;
        byte[] want = macHex(key, topic, format, size, payload);
        if (want == null) return false;
        return MessageDigest.isEqual(got, want);            // constant time
    }

    /** The sub-message bounds when the whole PUBLISH takes the fast path, else null. */
    static int[] fastBounds(String topic, byte[] payload, String[] props, long receivedUs, boolean noReceivedAt,
                            Options o, Map<String, byte[]> keys) {
        String device = device(topic);
        if (payload == null || noReceivedAt || device == null) return null;
        int expected = expectedCount(props, o);
        // a sub-message takes at least its 1-byte length prefix: more than that many cannot be "ok"
        // (and the bounds array stays within the payload's size, whatever batch-size says)
        if (expected < 0 || expected > payload.length || payload.length > o.maxPayloadBytes) return null;
        if (keys != null && !signed(topic, device, props, payload, keys)) return null;
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
    private static final byte[] HEX = "0123456789abcdef".getBytes(StandardCharsets.US_ASCII);

    /** The first n bytes of d as 2n lowercase hex digits (ASCII). */
    static byte[] hex(byte[] d, int n) {
        byte[] out = new byte[2 * n];
        for (int i = 0; i < n; i++) {
            out[2 * i] = HEX[(d[i] >> 4) & 0xf];
            out[2 * i + 1] = HEX[d[i] & 0xf];
        }
        return out;
    }

    /** mqbatch.spark.decoder._batch_id: sha-256 of topic, 0, json.dumps(properties), 0, payload;
     * 32 hex digits. Only called for topics and properties of printable ASCII (fastBounds). */
    static UTF8String batchId(String topic, String[] props, byte[] payload) {
        StringBuilder json = new StringBuilder(64).append('[');
        for (int i = 0; i < props.length; i += 2) {
            if (i > 0) json.append(", ");
            json.append("[\"").append(props[i]).append("\", \"").append(props[i + 1]).append("\"]");
        }
        json.append(']');
        MessageDigest sha = SHA256.get();
        sha.reset();
        sha.update(topic.getBytes(StandardCharsets.US_ASCII));
        sha.update((byte) 0);
        sha.update(json.toString().getBytes(StandardCharsets.US_ASCII));
        sha.update((byte) 0);
        sha.update(payload);
        return UTF8String.fromBytes(hex(sha.digest(), 16));
    }

    /** One record as Spark's row: struct(boot, seq, kind, synced, time_us, start, length,
     * readings array<struct<channel, name, value, scaled>>, dropped_total). */
    static InternalRow record(byte[] p, int s, int n) {
        int count = p[s + 3] & 0xff;
        Object[] readings = new Object[count];
        Object dropped = null;
        for (int i = 0; i < count; i++) {
            int at = s + HEADER + READING * i, ch = p[at] & 0xff;
            long v = i32(p, at + 1);
            readings[i] = new GenericInternalRow(new Object[]{ch, NAME[ch], v, v / DIVISOR[ch]});
            if (ch == DROPPED_TOTAL && dropped == null) dropped = v;
        }
        long timeMs = (EPOCH_2020_S + u32(p, s + 12)) * 1000 + ((p[s + 16] & 0xff) | (p[s + 17] & 0xff) << 8);
        return new GenericInternalRow(new Object[]{u32(p, s + 4), u32(p, s + 8), KINDS[p[s + 1]], (p[s + 2] & 1) == 1,
                                                   timeMs * 1000, s, n, new GenericArrayData(readings), dropped});
    }

    /** fastBounds, with any exception (a bug here) meaning "not fast": the Python decoders then
     * take the row. decode and isFast decide through this one method, so they always agree. */
    static int[] fastBoundsOrNull(UTF8String topic, byte[] payload, ArrayData props, long receivedUs,
                                  boolean noReceivedAt, Options o, Map<String, byte[]> keys) {
        try {
            return fastBounds(topic == null ? null : topic.toString(), payload, properties(props), receivedUs,
                              noReceivedAt, o, keys);
        } catch (RuntimeException e) {
            return null;
        }
    }

    /** The decoded landed row: struct(fast, batch_id, device, count, records), all but fast null
     * when the fast path does not take it (then counted in notFast). */
    public InternalRow decode(UTF8String topic, byte[] payload, ArrayData props, long receivedUs,
                              boolean noReceivedAt) {
        int[] bounds = fastBoundsOrNull(topic, payload, props, receivedUs, noReceivedAt, options(), keys());
        if (bounds == null) {
            if (notFast != null) notFast.add(1);
            return new GenericInternalRow(new Object[]{false, null, null, null, null});
        }
        // from here on an exception fails the task (loudly): fastBounds has said this row is ours
        int n = bounds.length / 2;
        Object[] recs = new Object[n];
        for (int k = 0; k < n; k++) recs[k] = record(payload, bounds[2 * k], bounds[2 * k + 1]);
        String t = topic.toString();
        return new GenericInternalRow(new Object[]{true, batchId(t, properties(props), payload),
                                                   UTF8String.fromString(device(t)), n, new GenericArrayData(recs)});
    }

    /** The "fast" flag alone: which landed rows the Python decoders must take. */
    public boolean isFast(UTF8String topic, byte[] payload, ArrayData props, long receivedUs, boolean noReceivedAt) {
        return fastBoundsOrNull(topic, payload, props, receivedUs, noReceivedAt, options(), keys()) != null;
    }

    // -- SQL -----------------------------------------------------------------------------
    /** Registers `name` in the session as a function of (topic, payload, user_properties,
     * received_at in microseconds, received_at is null) that calls `method` ("decode" or
     * "isFast") on `target`, returning `type`. */
    @SuppressWarnings("unchecked")
    public static void register(SparkSession session, String name, BatchDecoder target, String method, DataType type) {
        if (!method.equals("decode") && !method.equals("isFast"))
            throw new IllegalArgumentException("mqbatch BatchDecoder.register: no method " + method);
        Literal object = new Literal(target, new ObjectType(BatchDecoder.class));
        scala.collection.immutable.Seq<AbstractDataType> anyTypes =
            (scala.collection.immutable.Seq<AbstractDataType>) (Object) scala.collection.immutable.Nil$.MODULE$;
        scala.Function1<scala.collection.immutable.Seq<Expression>, Expression> builder = args -> {
            if (args.length() != 5)
                throw new IllegalArgumentException(name + " takes 5 arguments (topic, payload, user_properties, "
                                                   + "coalesce(unix_micros(received_at), 0), received_at IS NULL), not "
                                                   + args.length());
            if (args.apply(3).nullable() || args.apply(4).nullable())
                throw new IllegalArgumentException(name + ": its last two arguments must not be nullable");
            // propagateNull false: a null topic, payload or property list reaches the method (and
            // means "not fast"); a null for the long would make the result null (so it is never null);
            // returnNullable false: neither method returns null
            return new Invoke(object, method, type, args, anyTypes, false, false, true);
        };
        session.sessionState().functionRegistry().createOrReplaceTempFunction(name, builder, "scala_udf");
    }
}
