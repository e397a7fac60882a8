"""Where every stored record went, per device (issue 22; docs/reliability.md "Accounting").

A device with end-to-end acks keeps a batch in its outbox until a recorder says it is
landed. When the outbox needs room it lets the oldest go, counted in one of two health
channels (docs/records.md): `dropped_total` (0x82) for batches the broker never accepted
(they cannot land) and `released_unconfirmed` (0x87) for batches the broker accepted
(PUBACK) whose e2e ack had not come (they may have landed). Both are "since boot": the
highest value per (device, boot), summed over boots, is the device's count.

From the landed sequence numbers the job knows what is absent; with the two counters:

    stored  = landed + absent                    (the seqs up to the highest landed one)
    absent  = dropped + released_not_landed + lost
    released_not_landed = min(released, max(0, absent - dropped))
    released_landed     = released - released_not_landed
    lost    = max(0, absent - dropped - released)    absent and counted by nobody
    dropped_landed = max(0, dropped - absent)        the device counted more dropped than
                                                     is absent: its counter over-counts

`balanced` is true when stored = landed + dropped + released_not_landed exactly (no record
lost, no over-count). The split of `released` into landed and not landed assumes what the
device counts dropped never landed (the broker never accepted it); a record the job cannot
see at all (after a device's last landed record) is in neither side.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from mqbatch.wire.records import CHANNEL_BY_NAME

RELEASED_UNCONFIRMED = CHANNEL_BY_NAME["released_unconfirmed"].id
# the channels of the readings the report reads (the stream's _decoded/ keeps only these)
CHANNELS_READ = (RELEASED_UNCONFIRMED,)


def released_value() -> Column:
    """A valid record's highest released_unconfirmed reading (null when it has none)."""
    return F.expr(f"array_max(transform(filter(readings, r -> r.channel = {RELEASED_UNCONFIRMED}), r -> r.value))")


def released_per_boot(arrivals: DataFrame) -> DataFrame:
    """Per (device, boot) of the valid records (duplicates change no maximum): the highest
    released_unconfirmed reading."""
    return (
        arrivals.select("device", "boot", released_value().alias("_v"))
        .where(F.col("_v").isNotNull())
        .groupBy("device", "boot")
        .agg(F.max("_v").alias("released"))
    )


def balance(unique: int, absent: int, dropped: int, released: int) -> dict:
    """The accounting of one device from its counts (see the module's docstring)."""
    not_landed = min(released, max(0, absent - dropped))
    lost = max(0, absent - dropped - released)
    over = max(0, dropped - absent)
    return {
        "stored": unique + absent,
        "landed": unique,
        "absent": absent,
        "dropped": dropped,
        "released_unconfirmed": released,
        "released_landed": released - not_landed,
        "released_not_landed": not_landed,
        "lost": lost,
        "dropped_landed": over,
        "balanced": lost == 0 and over == 0,
    }


def add_accounting(devices: dict, released_rows: list) -> dict:
    """Give each device of build_report's `devices` its "accounting" (balance()), from its
    unique / missing / pending_gaps / dropped_on_device and released_per_boot's rows."""
    released: dict = {}
    for r in released_rows:
        released[r["device"]] = released.get(r["device"], 0) + (r["released"] or 0)
    for name, d in devices.items():
        absent = d["missing"] + d["pending_gaps"]
        d["accounting"] = balance(d["unique"], absent, d["dropped_on_device"], released.get(name, 0))
    return devices
