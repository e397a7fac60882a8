package mqbatch.jvm;

import java.util.Iterator;
import java.util.NoSuchElementException;

import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;

/**
 * The report's per-boot figures in one pass inside the executors' JVM: the same figures as
 * mqbatch.spark.arrival.boot_figures (its docstring defines them; the tests hold the two to
 * each other), without a Python worker or an Arrow exchange; and, when the rows carry them,
 * each boot's highest released_unconfirmed reading and each device's latency percentiles
 * (what accounting.released_per_boot and pipeline.latency_percentiles compute in Spark).
 *
 * Rows in: (device string, boot long, seq long, key boolean, dropped_total long or null),
 * a boot's rows in one partition, sorted by (device, boot, arrival); device, boot and seq
 * never null. Optionally two more: released (long or null) and latency (double or null:
 * null where the record's clock is not synchronised); then a device's rows must be in one
 * partition. Rows out, one per (device, boot) when its last row has been read: (device,
 * boot, unique, keys, max_seq, dropped_on_device or null, out_of_order, old), with the two
 * more: released (null when no row has one), and on the device's last boot its latency
 * n, p50, p95, p99 (Spark's `percentile`: linear between the two closest ranks; null on
 * its other boots and when it has no latency).
 *
 * Memory: one boot at a time, and of it the first arrivals' seqs that may still end up at
 * or below (highest seq - window): trimmed when twice max(1,024, window, what was kept) are
 * held, as the Python pass does. With latencies, a device's latencies: 8 bytes each, up to
 * twice that while the array grows, outside Spark's memory accounting (Spark's own percentile
 * holds a device's values too, boxed in a hash map).
 */
public final class BootFigures implements MapPartitionsFunction<Row, Row> {
    private static final long serialVersionUID = 1L;
    private final long window;

    public BootFigures(long window) {
        this.window = window;
    }

    /** The figures of `in` (columns as above, partitioned and sorted as above); `schema` is
     *  the result's (mqbatch.spark.arrival.SCHEMA). */
    public static Dataset<Row> apply(Dataset<Row> in, long window, DataType schema) {
        return in.mapPartitions(new BootFigures(window), Encoders.row((StructType) schema));
    }

    @Override
    public String toString() {
        return "BootFigures(window=" + window + ")";
    }

    /** One (device, boot) so far. */
    static final class Boot {
        final String device;
        final long boot;
        long unique, keys, late, old, maxSeq = -1, keyMax = -1, dropped, nextTrim, released;
        boolean hasDropped, hasReleased;
        long[] held = new long[64];
        int nHeld;

        Boot(String device, long boot) {
            this.device = device;
            this.boot = boot;
        }

        void add(long seq, boolean key, boolean hasDrop, long drop, long window) {
            unique++;
            if (seq > maxSeq) maxSeq = seq;
            if (hasDrop) {
                dropped = hasDropped ? Math.max(dropped, drop) : drop;
                hasDropped = true;
            }
            if (!key) return;
            keys++;
            if (seq < keyMax) late++;  // a first arrival after one with a higher seq
            else keyMax = seq;
            if (nHeld == held.length) held = java.util.Arrays.copyOf(held, 2 * nHeld);
            held[nHeld++] = seq;
            if (nHeld > nextTrim) trim(window);
        }

        /** Counts the held seqs at or below (highest - window) into `old` (the highest only
         *  grows: they stay there) and keeps the others. */
        void trim(long window) {
            long limit = maxSeq - window;
            int kept = 0;
            for (int i = 0; i < nHeld; i++) {
                if (held[i] <= limit) old++;
                else held[kept++] = held[i];
            }
            nHeld = kept;
            nextTrim = 2 * Math.max(Math.max(1024L, Math.min(window, 1L << 40)), kept);  // no overflow
        }

        void release(long value) {
            released = hasReleased ? Math.max(released, value) : value;
            hasReleased = true;
        }

        Row row(long window, Latency latency) {
            trim(window);
            Object drop = hasDropped ? (Object) dropped : null;
            if (latency == null) return RowFactory.create(device, boot, unique, keys, maxSeq, drop, late, old);
            Object rel = hasReleased ? (Object) released : null;
            if (latency.n == 0) return RowFactory.create(device, boot, unique, keys, maxSeq, drop, late, old, rel, null, null, null, null);
            double[] p = latency.percentiles(P50, P95, P99);
            return RowFactory.create(device, boot, unique, keys, maxSeq, drop, late, old, rel, (long) latency.n, p[0], p[1], p[2]);
        }
    }

    static final double P50 = 0.5, P95 = 0.95, P99 = 0.99;

    /** A device's latencies so far; percentiles as Spark's `percentile` computes them. */
    static final class Latency {
        double[] values = new double[64];
        int n;

        void add(double v) {
            if (n == values.length) values = java.util.Arrays.copyOf(values, 2 * n);
            values[n++] = v;
        }

        /** For each p: position (n - 1) * p between the ranks floor and ceil of it, the two
         *  values there weighted by the distance (the value itself when both are equal). */
        double[] percentiles(double... ps) {
            double[] sorted = values;  // sorted in place: the device's last use of them
            java.util.Arrays.sort(sorted, 0, n);
            double[] out = new double[ps.length];
            for (int i = 0; i < ps.length; i++) {
                double position = (n - 1L) * ps[i];
                long lower = (long) Math.floor(position), higher = (long) Math.ceil(position);
                double low = sorted[(int) lower], high = sorted[(int) higher];
                out[i] = higher == lower || high == low ? low : (higher - position) * low + (position - lower) * high;
            }
            return out;
        }
    }

    @Override
    public Iterator<Row> call(Iterator<Row> rows) {
        return new Iterator<Row>() {
            private Boot current;
            private Latency latency;  // of current's device, when the rows carry latencies
            private Row ready;

            private void advance() {
                while (ready == null && rows.hasNext()) {
                    Row r = rows.next();
                    boolean more = r.length() > 5;
                    String device = r.getString(0);
                    long boot = r.getLong(1);
                    if (current == null || current.boot != boot || !current.device.equals(device)) {
                        boolean otherDevice = current == null || !current.device.equals(device);
                        if (current != null) ready = current.row(window, more && !otherDevice ? NONE : latency);
                        current = new Boot(device, boot);
                        if (otherDevice && more) latency = new Latency();
                    }
                    boolean hasDrop = !r.isNullAt(4);
                    current.add(r.getLong(2), r.getBoolean(3), hasDrop, hasDrop ? r.getLong(4) : 0L, window);
                    if (more) {
                        if (!r.isNullAt(5)) current.release(r.getLong(5));
                        if (!r.isNullAt(6)) latency.add(r.getDouble(6));
                    }
                }
                if (ready == null && current != null) {  // the partition's last boot
                    ready = current.row(window, latency);
                    current = null;
                }
            }

            @Override
            public boolean hasNext() {
                advance();
                return ready != null;
            }

            @Override
            public Row next() {
                advance();
                if (ready == null) throw new NoSuchElementException();
                Row out = ready;
                ready = null;
                return out;
            }
        };
    }

    /** A boot that is not its device's last: no latency figures on its row. */
    static final Latency NONE = new Latency();
}
