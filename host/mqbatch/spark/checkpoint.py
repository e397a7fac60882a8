"""A stream's checkpoint before any JVM: one stream per checkpoint (an flock on
CHECKPOINT/.lock that the kernel drops when its holder dies) and an --out that only ever
holds the commits of one checkpoint (its random id noted beside them). Without pyspark:
`mqbatch spark` checks both before spark-submit starts, and the job again (mqbatch.spark.stream)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import secrets

from mqbatch.spark.lines import LOCK_HELD
from mqbatch.util.private import open_private, private_dir, write_private


def commits_mark(out: pathlib.Path) -> list:
    names = sorted(p.name for p in (out / "_batches").glob("*.json"))
    return [len(names), names[-1] if names else None]


_HELD: dict[str, int] = {}  # checkpoints this process has locked (lock_checkpoint): path -> fd


def lock_checkpoint(checkpoint: str) -> int:
    """Take the exclusive flock on CHECKPOINT/.lock for the rest of this process (the kernel
    drops it when the process dies, SIGKILL included), or SystemExit with one line when another
    job streams with the same checkpoint (Spark would end one of them later with
    CONCURRENT_STREAM_LOG_UPDATE). The job takes it before its JVM starts, so a second job
    fails at once; run_stream takes it itself when called directly."""
    key = os.path.realpath(checkpoint)
    if key in _HELD:
        return _HELD[key]
    private_dir(checkpoint, tighten=True)
    fd = open_private(os.path.join(checkpoint, ".lock"), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SystemExit(
            f"{LOCK_HELD} {checkpoint} (its .lock is held); stop it first or give --checkpoint another folder"
        ) from None
    _HELD[key] = fd
    return fd


def checkpoint_of(out: str, checkpoint: str | None) -> str:
    """The stream's checkpoint folder: --checkpoint, else OUT/_checkpoint."""
    return checkpoint or f"{out}/_checkpoint"


STREAM_CHECKPOINT = ".stream-checkpoint"  # under --out: the id of the checkpoint whose batch ids its commits are
STREAM_ID = ".stream-id"  # under the checkpoint: its id (a folder moved with its --out keeps it)


def check_same_checkpoint(out: str, checkpoint: str) -> None:
    """SystemExit with one line when --out holds commits (_batches/N.json) that are not this
    checkpoint's: Spark numbers micro-batches per checkpoint, so a new or emptied checkpoint
    starts again at 0 and each batch whose id has a commit would be skipped as "already
    committed": its files never processed. The checkpoint gets a random id (STREAM_ID) and
    --out notes it (STREAM_CHECKPOINT); an --out written before the note adopts the checkpoint
    it is used with if that one has stream state."""
    out_p, ck = pathlib.Path(out), pathlib.Path(checkpoint)
    mark, id_file = out_p / STREAM_CHECKPOINT, ck / STREAM_ID
    recorded = mark.read_text(encoding="utf-8").strip() if mark.is_file() else None
    ck_id = id_file.read_text(encoding="utf-8").strip() if id_file.is_file() else None
    offsets = ck / "landing" / "offsets"
    has_state = offsets.is_dir() and any(offsets.iterdir())
    if commits_mark(out_p)[0] and not has_state:
        raise SystemExit(
            f"telemetry_job: --out {out} holds committed micro-batches but the checkpoint {checkpoint} has no "
            "stream state (new or emptied): its batch ids would start again at 0 and new files be skipped; "
            "give the stream's own checkpoint, or another --out"
        )
    if recorded is not None and recorded != ck_id:
        raise SystemExit(
            f"telemetry_job: --out {out} holds the commits of another stream's checkpoint, not of {checkpoint}: "
            "give that stream's --checkpoint, or another --out"
        )
    if ck_id is None:
        ck_id = secrets.token_hex(16)
        private_dir(ck)
        write_private(id_file, ck_id + "\n")
    if recorded is None:
        private_dir(out_p)
        write_private(mark, ck_id + "\n")


def take_checkpoint(out: str, checkpoint: str | None) -> str:
    """What a stream does before its JVM starts: --out a 0700 folder, the checkpoint's lock taken
    for the rest of this process (lock_checkpoint) and its commits checked to be the
    checkpoint's (check_same_checkpoint; on a refusal the lock is let go again, if taken here).
    Returns the checkpoint folder."""
    private_dir(out)
    path = checkpoint_of(out, checkpoint)
    key = os.path.realpath(path)
    held = key in _HELD
    lock_checkpoint(path)
    try:
        check_same_checkpoint(out, path)
    except BaseException:
        if not held:
            os.close(_HELD.pop(key))
        raise
    return path


def check_checkpoint_free(out: str, checkpoint: str | None) -> None:
    """take_checkpoint, but the lock is let go at once: `mqbatch spark` refuses a second stream
    on a checkpoint, or an --out of another checkpoint, in one line before spark-submit starts a
    JVM (the job then takes the lock itself, and holds it)."""
    key = os.path.realpath(checkpoint_of(out, checkpoint))
    held = key in _HELD
    take_checkpoint(out, checkpoint)
    if not held:
        os.close(_HELD.pop(key))


@contextlib.contextmanager
def hold_checkpoint(checkpoint: str):
    """lock_checkpoint for the block (kept if this process held it before the block)."""
    key = os.path.realpath(checkpoint)
    held = key in _HELD
    lock_checkpoint(checkpoint)
    try:
        yield
    finally:
        if not held:
            os.close(_HELD.pop(key))
