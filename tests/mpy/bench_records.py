# bench_records: the records the device benchmarks write (record_bench.py, wire_bench.py):
# 4 channels (temperature = the record's index in its batch, humidity, supply voltage,
# RSSI), 38 bytes each, with RecordWriter.sample into a caller-owned BatchEncoder, the
# channels and values of the types the App passes (bytes, array("i")).
from array import array
from mqb_codec import BatchEncoder, FULL
from mqb_record import RecordWriter, TickClock

CHANNELS = (1, 2, 3, 4)


def batch_filler(batch, buf_size, headroom=80):
    """(encoder, fill): fill() resets the encoder and writes `batch` records into it
    (allocation-free: RecordWriter packs into the encoder's buffer)."""
    enc = BatchEncoder(bytearray(buf_size), headroom=headroom, max_count=batch)
    clock = TickClock()
    clock.set_from_rtc(True)
    w = RecordWriter(enc, clock, boot=1)
    channels = bytes(CHANNELS)       # what the App passes (mqb_app: bytes(board.CHANNELS))
    vals = array("i", [0, 4500, 3300, -67])

    def fill():
        enc.reset()
        i = 0
        while i < batch:
            vals[0] = i
            if w.sample(channels, vals) == FULL:
                raise RuntimeError("batch full after %d records" % i)
            i += 1
    return enc, fill
