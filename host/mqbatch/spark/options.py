"""The job's options, without PySpark: `mqbatch spark` parses and checks them
before it starts a JVM, and the job (mqbatch.spark.job) parses the same ones."""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import stat

from mqbatch.util.argtypes import positive_int as _positive
from mqbatch.wire import codec, integrity
from mqbatch.wire.device_id import device_id_problem
from mqbatch.wire.integrity import write_hmac_keys  # noqa: F401 (re-exported: the job's keys file)

LOG_LEVELS = ("ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")


@dataclasses.dataclass(frozen=True)
class JobOptions:
    partial: bool = False
    max_batch_size: int = 100
    max_payload_bytes: int = 65536
    allow_empty: bool = True
    reorder_window: int = 100  # a missing seq counts as lost once the boot is this far past it
    max_future_s: int = 86400  # device time this far after received_at is RECORD_TIME_IN_FUTURE
    watermark: str = "1 hour"  # --stream: how late a duplicate may arrive and still be dropped
    # --hmac-keys: None (no batch-hmac check) or ((device, key bytes), ...) sorted; secret: not in repr
    hmac_keys: tuple | None = dataclasses.field(default=None, repr=False)

    def report_dict(self) -> dict:
        """The options for report.json: the keys themselves are replaced by the devices they
        are for; without --hmac-keys the report is as before (no hmac_keys entry)."""
        d = dataclasses.asdict(self)
        if self.hmac_keys is None:
            del d["hmac_keys"]
        else:
            d["hmac_keys"] = [device for device, _ in self.hmac_keys]
        return d

    def decode_options(self) -> codec.DecodeOptions:
        return codec.DecodeOptions(
            max_batch_size=self.max_batch_size,
            max_payload_bytes=self.max_payload_bytes,
            allow_empty=self.allow_empty,
            partial=self.partial,
        )


# landing MiB per micro-batch: a 10,000-device run's micro-batch of 31 MB of landing files (2.25 M
# records) ran out of the default driver heap; 12.9 MB (0.94 M) did not (docs/scale.md)
DEFAULT_MAX_MB_PER_TRIGGER = 16


def _non_negative(text: str) -> int:
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n


def load_hmac_keys(path: str) -> tuple:
    """The --hmac-keys file: a JSON object {device id: hex key}, readable by its owner only.
    Returns ((device, key bytes), ...) sorted by device; SystemExit says what is wrong."""
    where = f"mqbatch spark: --hmac-keys {path!r}"
    try:
        mode = pathlib.Path(path).stat().st_mode
    except OSError as e:
        raise SystemExit(f"{where}: {e.strerror}") from None
    if not stat.S_ISREG(mode):
        raise SystemExit(f"{where} is not a regular file")
    if mode & 0o077:
        raise SystemExit(
            f"{where} is readable or writable by others (mode {stat.S_IMODE(mode):04o}): it holds "
            f"every device's secret key; chmod 600 it"
        )
    try:
        data = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SystemExit(f"{where} is not readable JSON: {e}") from None
    if not isinstance(data, dict):
        raise SystemExit(f"{where} must hold a JSON object {{device id: hex key}}, not {type(data).__name__}")
    keys = []
    for device, text in sorted(data.items()):
        problem = device_id_problem(device)
        if problem is not None:
            raise SystemExit(f"{where}: {problem}")
        try:
            keys.append((device, integrity.parse_key(text)))
        except ValueError as e:
            raise SystemExit(f"{where}: device {device!r}: {e}") from None
    return tuple(keys)


def add_arguments(p: argparse.ArgumentParser, paths_required: bool = True) -> None:
    """The job's options (shared with `mqbatch spark`, which checks --landing and --out itself
    because its --prepare needs neither: paths_required False)."""
    p.add_argument(
        "--landing", required=paths_required, help="landing zone directory (Parquet files of `mqbatch ingest`)"
    )
    p.add_argument("--out", required=paths_required, help="output directory: records/, quarantine/, report.json")
    p.add_argument("--partial", action="store_true", help="deliver sub-messages parsed before a count mismatch")
    p.add_argument("--max-batch-size", type=_positive, default=100)
    p.add_argument("--max-payload-bytes", type=_positive, default=65536)
    p.add_argument("--no-empty", action="store_true", help="reject zero-length sub-messages")
    p.add_argument(
        "--reorder-window",
        type=_non_negative,
        default=100,
        help="a missing seq counts as lost once the boot's highest seq is this many past it (default 100)",
    )
    p.add_argument(
        "--max-future-s",
        type=_positive,
        default=86400,
        help="quarantine records whose device time is this far after received_at (default 86400)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--stream",
        action="store_true",
        help="keep running: a micro-batch every --trigger-seconds until stopped (SIGINT/SIGTERM)",
    )
    mode.add_argument(
        "--once", action="store_true", help="streaming, once: process every landing file not yet processed, then stop"
    )
    p.add_argument("--trigger-seconds", type=_positive, default=10, help="--stream: micro-batch interval (default 10)")
    p.add_argument(
        "--no-warm-up",
        action="store_true",
        help="--stream: take the landing zone at once; by default the job first runs two small micro-batches "
        "of its own (16-19 s measured on 2 cores beside a 10,000-device fleet) so that the first landing files do not wait for a "
        "cold JVM (docs/spark.md)",
    )
    p.add_argument(
        "--report-seconds",
        type=_non_negative,
        default=0,
        help="--stream: recompute report.json at most this often; a micro-batch in between writes its rows "
        "and commit only, and report.json stays an earlier commit's until a later micro-batch or the next "
        "start (also while idle, and after a stop) (default 0: after every micro-batch)",
    )
    p.add_argument(
        "--max-mb-per-trigger",
        type=_non_negative,
        default=DEFAULT_MAX_MB_PER_TRIGGER,
        help="--stream/--once: a micro-batch takes at most this many MiB of landing files (at least one file; "
        f"0: no limit; default {DEFAULT_MAX_MB_PER_TRIGGER}, about a million 10-record-batch records: a backlog "
        "is taken in bounded steps, not in one micro-batch that outgrows the driver's heap)",
    )
    p.add_argument("--checkpoint", help="--stream/--once checkpoint directory (default OUT/_checkpoint)")
    p.add_argument(
        "--watermark",
        default="1 hour",
        help="--stream/--once: how late a duplicate may arrive and still be dropped (default '1 hour')",
    )
    p.add_argument(
        "--hmac-keys",
        metavar="FILE",
        help="verify each batch's batch-hmac with its device's key from FILE (JSON {device: hex key}, "
        "mode 0600); a batch that fails is quarantined (BATCH_HMAC_*). Default: no check",
    )
    p.add_argument("--master", help="Spark master when not given by spark-submit (default local[*])")
    p.add_argument(
        "--log-level", default="WARN", type=str.upper, choices=LOG_LEVELS, help="Spark's log level (default WARN)"
    )


def options_from(args: argparse.Namespace) -> JobOptions:
    return JobOptions(
        partial=args.partial,
        max_batch_size=args.max_batch_size,
        max_payload_bytes=args.max_payload_bytes,
        allow_empty=not args.no_empty,
        reorder_window=args.reorder_window,
        max_future_s=args.max_future_s,
        watermark=args.watermark,
        hmac_keys=load_hmac_keys(args.hmac_keys) if getattr(args, "hmac_keys", None) else None,
    )


def check_paths(args: argparse.Namespace) -> None:
    """Fail fast (before any JVM starts) on a local --landing that is not a directory
    or a local --out that cannot be a directory. URLs (hdfs://, s3a://) are left to Spark."""
    if "://" not in args.landing and not pathlib.Path(args.landing).is_dir():
        raise SystemExit(f"mqbatch spark: --landing {args.landing!r} is not a directory")
    if "://" not in args.out:
        out = pathlib.Path(args.out)
        if out.exists() and not out.is_dir():
            raise SystemExit(f"mqbatch spark: --out {args.out!r} exists and is not a directory")
    if getattr(args, "hmac_keys", None):
        load_hmac_keys(args.hmac_keys)  # its mode, JSON and every key, before a JVM starts
    if (args.stream or args.once) and "://" in args.out:
        raise SystemExit("mqbatch spark: --stream/--once write to a local --out only (they commit by renaming files)")
    checkpoint = getattr(args, "checkpoint", None)
    if (args.stream or args.once) and checkpoint:
        if "://" in checkpoint:
            raise SystemExit("mqbatch spark: --checkpoint must be a local folder (the stream locks it with flock)")
        if pathlib.Path(checkpoint).exists() and not pathlib.Path(checkpoint).is_dir():
            raise SystemExit(f"mqbatch spark: --checkpoint {checkpoint!r} exists and is not a directory")
