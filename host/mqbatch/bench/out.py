"""Benchmark results as files: every `mqbatch bench TARGET` writes OUT/TARGET.json
(default OUT: run/bench under the current directory) holding its figures and what
they were measured on: the machine, the versions and the exact command.

    write_result(args, "wire", {...})      # -> run/bench/wire.json
    load_results(pathlib.Path("run/bench")) # {"wire": {...}, "device": {...}, ...}
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shlex
import ssl
import statistics
import subprocess
import sys

DEFAULT_OUT = pathlib.Path("run") / "bench"
TARGETS = ("wire", "device", "ingest", "spark", "latency", "fleet", "e2e-cost")
ROOT = pathlib.Path(__file__).resolve().parents[3]

# set by `bench all` while it runs a target: the command that target stands for, and
# whether it runs as part of `bench all --quick` (a smoke test even where the target has no --quick)
command_override: str | None = None
quick_override = False


def add_out(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out",
        type=pathlib.Path,
        default=DEFAULT_OUT,
        help=f"directory for TARGET.json (default {DEFAULT_OUT}, created if missing)",
    )


def command() -> str:
    return command_override or "mqbatch " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _first_line(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    return ((p.stdout or p.stderr).strip().splitlines() or ["unknown"])[0]


def machine() -> dict:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass  # not Linux: the model stays unknown, the rest is still reported
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": round(mem_gb, 1),
        "os": f"{platform.system()} {platform.release()}",
        "load_average": [round(x, 2) for x in os.getloadavg()],
        # extra options of every JVM spark-submit starts (the test suite sets C1-only JIT)
        "spark_submit_opts": os.environ.get("SPARK_SUBMIT_OPTS") or None,
        # the Spark JVMs' class-data archive (mqbatch.spark.cds), when one had been written
        "jvm_cds_archive": _cds_archive(),
    }


def _cds_archive() -> str | None:
    from mqbatch.spark import cds

    path = cds.written()
    return None if path is None else str(path)


def versions() -> dict:
    from importlib import metadata

    from mqbatch import version
    from mqbatch.lab.broker import MOSQUITTO
    from mqbatch.util.paths import micropython_exe

    out = {
        "mqbatch": version(),
        "python": platform.python_version(),
        "openssl": ssl.OPENSSL_VERSION,
        "micropython": _first_line([str(micropython_exe()), "-c", "import sys; print(sys.version)"]),
        "mosquitto": _first_line([str(MOSQUITTO), "-h"]),
    }
    if (ROOT / ".git").exists():
        rev = _first_line(["git", "-C", str(ROOT), "describe", "--always", "--dirty"])
        out["commit"] = rev
    for dist in ("paho-mqtt", "pyspark", "pyarrow", "matplotlib"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def write_result(args: argparse.Namespace, target: str, figures: dict) -> pathlib.Path:
    """OUT/TARGET.json with the figures, the machine, the versions and the command."""
    out = pathlib.Path(getattr(args, "out", None) or DEFAULT_OUT)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "target": target,
        "command": command(),
        "quick": bool(getattr(args, "quick", False) or quick_override),
        "finished_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "versions": versions(),
        "figures": figures,
    }
    path = out / f"{target}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(path)
    print(f"results: {path}")
    return path


def load_results(out: pathlib.Path) -> dict[str, dict]:
    """The TARGET.json files present in `out`, by target."""
    return {t: json.loads((out / f"{t}.json").read_text()) for t in TARGETS if (out / f"{t}.json").is_file()}


def machine_busy_s() -> float | None:
    """CPU seconds the whole machine has spent busy since boot, all cores and processes (user,
    nice, system, irq, softirq of /proc/stat; not idle, iowait, nor steal, which is time the
    hypervisor gave to others; guest time is within user); None off Linux. The
    difference over a run is the CPU the run cost when nothing else runs, the JVM, its Python
    workers and the driver together, where a process's own counter sees only itself."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    except (OSError, ValueError):  # (a short line: too few values to unpack)
        return None
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def spread(values: list[float], fmt: str, unit: str = "", sep: str = "..") -> str:
    """`median[ unit] [min<sep>max]` of values, each formatted with fmt (the benchmarks'
    one way of giving a repeated figure: bench device, wire, resend, ingest, the report)."""
    lo, mid, hi = (format(v, fmt) for v in (min(values), statistics.median(values), max(values)))
    return f"{mid}{' ' + unit if unit else ''} [{lo}{sep}{hi}]"
