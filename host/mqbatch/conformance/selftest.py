"""`mqbatch conformance self-test`: the harness against publishers that break one rule each.

Each faulty publisher is either the raw-socket publisher with a fault (mqbatch.lab.rawpub
--fault NAME) or the firmware application with one mutation applied to a TEMPORARY COPY of
one firmware module (compiled into that run's image; firmware/ is never touched). Each runs
the scenarios that can expose its fault and must FAIL on its own row, and on no row but the
ones that restate it (`same_as`), summarise it (BATCH-5-2) or follow from it (`also`: e.g. a
broker that closes the connection on a protocol error, so records are not delivered). The
clean raw publisher runs every scenario the faulty ones use and must FAIL nowhere.
Kill rate = faulty publishers failed on their own row and only where allowed / all of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import pathlib
import shutil
import subprocess
import sys
import time

from mqbatch.conformance import matrix as M
from mqbatch.conformance.plan import BY_NAME
from mqbatch.conformance.publisher import run_publisher
from mqbatch.lab.rawpub import FAULTS

DELIV = "PUBLISHER-DELIVERS"


@dataclasses.dataclass
class Mutant:
    name: str
    row: str  # the row it must FAIL
    scenarios: list[str]
    fault: str | None = None  # rawpub --fault
    firmware: tuple[str, ...] | None = None  # (module, text, replacement, ...) in a copy of firmware/
    also: tuple[str, ...] = ()  # rows that may FAIL as a consequence
    ci: bool = False  # in the short self-test of `make test`

    @property
    def what(self) -> str:
        if self.fault:
            return FAULTS[self.fault]
        if not self.firmware:
            return "nothing (the clean raw publisher)"
        f = self.firmware or ()
        return "; ".join(f"firmware {m}: `{o}` -> `{n}`" for m, o, n in zip(f[::3], f[1::3], f[2::3]))


MUTANTS = [
    Mutant("silent", DELIV, ["default"], "silent", ci=True),
    Mutant("crash", DELIV, ["default"], "crash"),
    Mutant("lose-records", DELIV, ["default"], "lose-records"),
    Mutant("oversize-1", "MQTT-MAX-PACKET-SIZE", ["max-packet-200"], "oversize-1", also=(DELIV,), ci=True),
    Mutant("ignore-receive-max", "MQTT-RECEIVE-MAX", ["inflight-2"], "ignore-receive-max", ci=True),
    Mutant("no-limits", "BATCH-3.1-5", ["limits-10-2048", "limits-100-400"], "no-limits", ci=True),
    Mutant("sub-id", "MQTT-SUB-ID", ["default"], "sub-id", also=(DELIV,)),
    Mutant("empty-batch", "BATCH-3.1-3", ["default"], "empty-batch"),
    Mutant("wrong-count", "BATCH-3.1-2", ["default"], "wrong-count"),
    Mutant("bad-format", "BATCH-3.1-1", ["default"], "bad-format"),
    Mutant("alias-0", "MQTT-TOPIC-ALIAS-0", ["default"], "alias-0", also=(DELIV,)),
    Mutant("alias-over", "MQTT-TOPIC-ALIAS", ["alias-0"], "alias-over", also=(DELIV,)),
    Mutant("silent-keepalive", "MQTT-KEEPALIVE", ["keepalive-1"], "silent-keepalive", also=(DELIV,), ci=True),
    Mutant("no-pubrel", "MQTT-PUBREL", ["qos2-live"], "no-pubrel", also=(DELIV,)),
    Mutant("no-dup", "MQTT-DUP-RESEND", ["resume-dup"], "no-dup"),
    Mutant("dup-first", "MQTT-DUP", ["default"], "dup-first"),
    Mutant("no-resend", "MQTT-RESEND", ["resume-dup"], "no-resend", also=(DELIV,)),
    Mutant("resend-reverse", "MQTT-RESEND-ORDER", ["resume-order"], "resend-reverse"),
    Mutant("clean-start-resend", "MQTT-SESSION", ["resume-dup"], "clean-start-resend"),
    Mutant("keep-lost-session", "MQTT-SESSION", ["session-lost"], "keep-lost-session"),
    Mutant("pid-reuse", "MQTT-PACKET-ID", ["inflight-2"], "pid-reuse", also=(DELIV,)),
    Mutant("qos-over", "MQTT-MAX-QOS", ["max-qos-0"], "qos-over", also=(DELIV,)),
    Mutant("retain-anyway", "MQTT-RETAIN", ["retain-unavailable"], "retain-anyway", also=(DELIV,)),
    Mutant("after-disconnect", "MQTT-AFTER-DISCONNECT", ["default"], "after-disconnect"),
    Mutant("mqtt311", "MQTT-VERSION", ["default"], "mqtt311", also=(DELIV,)),
    Mutant("reason-code", "MQTT-REASON-CODE", ["default"], "reason-code"),
    Mutant("first-not-connect", "MQTT-FIRST-CONNECT", ["default"], "first-not-connect"),
    Mutant("bad-utf8", "MQTT-UTF8", ["default"], "bad-utf8", also=(DELIV,)),
    Mutant("truncated", "MQTT-REMAINING-LENGTH", ["default"], "truncated"),
    Mutant("unknown-prop", "MQTT-PROPERTIES", ["default"], "unknown-prop", also=(DELIV,)),
    Mutant("compress-userprop", "BATCH-8-COMPRESSION", ["default"], "compress-userprop"),
    Mutant("qos0-dup", "MQTT-FIXED-HEADER", ["max-qos-0"], "qos0-dup", also=(DELIV,)),
    Mutant(
        "fw-no-dup",
        "MQTT-DUP-RESEND",
        ["resume-dup"],
        firmware=("mqb_inflight.py", "(0x08 if resend_pid else 0)", "0"),
        ci=True,
    ),
    Mutant(
        "fw-ignore-receive-max",
        "MQTT-RECEIVE-MAX",
        ["inflight-1"],
        firmware=(
            "mqb_client.py",
            "self.limit = min(self.receive_max, ca.receive_max)",
            "self.limit = self.receive_max",
        ),
    ),
    Mutant(
        "fw-count+1",
        "BATCH-3.1-5",
        ["limits-10-2048"],
        firmware=(
            "mqb_codec.py",
            "if self.count >= self.max_count or self.end",
            "if self.count > self.max_count or self.end",
            "mqb_flush.py",
            "if enc.count >= enc.max_count or",
            "if enc.count > enc.max_count or",
        ),
    ),
    Mutant(
        "fw-no-ping",
        "MQTT-KEEPALIVE",
        ["keepalive-1"],
        firmware=("mqb_client.py", "elif time.ticks_diff(now, self._rs[_LAST_TX]) >= ka - (ka >> 2):", "elif False:"),
        also=(DELIV,),
    ),
]
CLEAN = [sys.executable, "-m", "mqbatch.lab.rawpub"]


def allowed_rows(m: Mutant) -> set[str]:
    rules = {r.id: r for r in M.REQUIREMENTS}
    own = set(rules[m.row].check[1]) if rules[m.row].check[0] == "pub" else set()
    out = {m.row, *m.also}
    out |= {r.id for r in M.REQUIREMENTS if r.same_as == m.row}
    out |= {r.id for r in M.REQUIREMENTS if r.same_as == "summary" and own and own <= set(r.check[1])}
    return out


def firmware_patch(*edits: str):
    """A fleet hook: mutated copies of firmware modules compiled into the fleet's image. edits:
    module, text, replacement[, module, text, replacement ...] (each text found exactly once)."""

    def patch(fleet) -> None:
        from mqbatch.fleet.deploy import board_settings
        from mqbatch.lab.romfs_run import build_image
        from mqbatch.util.paths import FIRMWARE, mpy_cross_exe

        tmp = fleet.run_dir / "mutant"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for mod, old, new in zip(edits[::3], edits[1::3], edits[2::3]):
            src = (tmp / mod).read_text() if (tmp / mod).exists() else (FIRMWARE / mod).read_text()
            if src.count(old) != 1:
                raise RuntimeError(f"mutation of {mod}: {old!r} found {src.count(old)} times (want once)")
            (tmp / mod).write_text(src.replace(old, new))
        args = board_settings("unix")["mpy_cross_args"]
        for src in tmp.glob("*.py"):
            dst = fleet.firmware / (src.stem + ".mpy")
            subprocess.run([str(mpy_cross_exe()), *args, "-o", str(dst), str(src)], check=True)
        with contextlib.redirect_stdout(io.StringIO()):  # build_image prints the tree
            build_image(fleet.firmware, fleet.image)

    return patch


def _failed_rows(run: dict) -> list[str]:
    return [r["id"] for r in M.verdicts(run, None, None) if r["verdict"] == M.FAIL]


def run(workdir: pathlib.Path, full: bool = False, only: list[str] | None = None, progress=print, mutants=None) -> dict:
    """mutants: run these instead of MUTANTS (full/only select among MUTANTS)."""
    if mutants is None:
        mutants = [m for m in MUTANTS if (m.name in only if only else (full or m.ci))]
    work = pathlib.Path(workdir)
    out = []
    for m in mutants:
        t0 = time.monotonic()
        scen = [BY_NAME[n] for n in m.scenarios]
        if not m.firmware:
            cmd = [*CLEAN, "--fault", m.fault] if m.fault else CLEAN
            res = run_publisher(scen, work / m.name, cmd=cmd, progress=lambda *_: None)
        else:
            res = run_publisher(scen, work / m.name, progress=lambda *_: None, patch=firmware_patch(*m.firmware))
        failed = _failed_rows(res)
        allowed = allowed_rows(m)
        killed = m.row in failed and set(failed) <= allowed
        why = (
            f"{m.row} did not FAIL"
            if m.row not in failed
            else f"also FAILED where no rule is broken: {sorted(set(failed) - allowed)}"
        )
        out.append(
            {
                "name": m.name,
                "what": m.what,
                "scenarios": m.scenarios,
                "row": m.row,
                "failed": failed,
                "killed": killed,
                "why": "" if killed else why,
                "seconds": round(time.monotonic() - t0, 1),
                "evidence": next((r["evidence"][:600] for r in M.verdicts(res, None, None) if r["id"] == m.row), ""),
            }
        )
        progress(
            f"  {m.name:22} {'killed' if killed else 'SURVIVED'} ({', '.join(failed) or 'no FAIL'}) "
            f"{out[-1]['seconds']} s"
        )
    names = sorted({n for m in mutants for n in m.scenarios})
    t0 = time.monotonic()
    clean = run_publisher([BY_NAME[n] for n in names], work / "clean", cmd=CLEAN, progress=lambda *_: None)
    clean_failed = _failed_rows(clean)
    progress(
        f"  clean rawpub on {len(names)} scenarios: {', '.join(clean_failed) or 'no FAIL'} "
        f"{time.monotonic() - t0:.1f} s"
    )
    killed = sum(1 for x in out if x["killed"])
    return {
        "faulty": len(out),
        "killed": killed,
        "rate": killed / len(out) if out else 0.0,
        "clean_ok": not clean_failed,
        "clean_failed": clean_failed,
        "clean_scenarios": names,
        "mutants": out,
    }
