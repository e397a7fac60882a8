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
 * each other), without a Python worker or an Arrow exchange.
 *
 * Rows in: (device string, boot long, seq long, key boolean, dropped_total long or null),
 * a boot's rows in one partition, sorted by (device, boot, arrival); device, boot and seq
 * never null. Rows out, one per (device, boot) when its last row has been read: (device,
 * boot, unique, keys, max_seq, dropped_on_device or null, out_of_order, old).
 *
 * Memory: one boot at a time, and of it the first arrivals' seqs that may still end up at
 * or below (highest seq - window): trimmed when twice max(1,024, window, what was kept) are
 * held, as the Python pass does.
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
        long unique, keys, late, old, maxSeq = -1, keyMax = -1, dropped, nextTrim;
        boolean hasDropped;
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

        Row row(long window) {
            trim(window);
            return RowFactory.create(device, boot, unique, keys, maxSeq, hasDropped ? (Object) dropped : null, late, old);
        }
    }

    @Override
    public Iterator<Row> call(Iterator<Row> rows) {
        return new Iterator<Row>() {
            private Boot current;
            private Row ready;

            private void advance() {
                while (ready == null && rows.hasNext()) {
                    Row r = rows.next();
                    String device = r.getString(0);
                    long boot = r.getLong(1);
                    if (current == null || current.boot != boot || !current.device.equals(device)) {
                        if (current != null) ready = current.row(window);
                        current = new Boot(device, boot);
                    }
                    boolean hasDrop = !r.isNullAt(4);
                    current.add(r.getLong(2), r.getBoolean(3), hasDrop, hasDrop ? r.getLong(4) : 0L, window);
                }
                if (ready == null && current != null) {  // the partition's last boot
                    ready = current.row(window);
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
}
