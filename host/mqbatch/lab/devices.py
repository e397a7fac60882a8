"""Virtual devices: N MicroPython Unix-port processes, each running the real
firmware application (firmware/ compiled to .mpy, board `unix`) with its own
identity, credentials and flash directory.

    fleet = Fleet(run_dir, broker_host, broker_port, ca=pki.ca_cert, credentials={"dev-001": "pw", ...},
                  hmac_keys={"dev-001": key_bytes, ...})      # optional: the devices sign each batch
    fleet.start()                    # one process per device
    fleet.kill("dev-001")            # SIGKILL: a power cut
    fleet.start_device("dev-001")    # reboot: boot counter +1, outbox resent
    fleet.wait(timeout)              # each run ends by itself after run_for_s + draining
    fleet.summaries()                # the MQB-SUMMARY line of each device's last run
    fleet.stored()                   # every (device, boot, seq) a device reported stored in its outbox

Each device's flash directory is <run_dir>/<device>/ (config.json, ca.pem,
boot.py, outbox/, boot counter); what it prints goes to console.log there.
The compiled firmware is one ROMFS image, mapped outside each interpreter's heap
(mqbatch.lab.romfs_run, boards/unix/boot.py) as ROMFS or frozen code sits in a
board's flash: `heapsize` then limits the application's own RAM. The default is
DEFAULT_HEAP, "96K". The application is measured to run in 64K (docs/application.md,
Memory: peak_heap_live ~61-62 KB of its 64,768 B with every feature on, hmac_key
included), but that leaves no room for the transient allocations of a TLS
handshake in a fragmented heap: a `make test` demo run died with MemoryError
reconnecting after the network cut (peak_heap_live 61,984 B). The tests that
prove the 64K figure pass heapsize="64K" themselves; None gives the port's default heap.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

from mqbatch.fleet.deploy import compile_firmware
from mqbatch.lab.romfs_run import build_image
from mqbatch.util.paths import BOARDS
from mqbatch.util.private import open_private, private_dir, write_private
from mqbatch.util.procs import end_process

DEFAULT_HEAP = "96K"  # see the module docstring: 64K is the measured floor, not a default with margin


class DeviceError(RuntimeError):
    pass


# Config a virtual device starts from (under what the caller passes): sized for a
# 64 KB heap (docs/application.md, Memory). flush.max_bytes: each of the two batch
# buffers is max_bytes + 160 bytes of RAM (main.py); outbox.max_entries: the outbox's RAM
# index is segments x max_entries x 7 bytes (batches of ~2 KB: 7-8 per 16 KB segment).
DEVICE_DEFAULTS = {"flush": {"max_bytes": 2048}, "outbox": {"max_entries": 16}}
MAX_SAMPLE_HZ = 1000.0  # the firmware's limit (mqb_app: sample_hz in (0, 1000])


def _merged(base: dict, over: dict) -> dict:
    """A deep copy of base with over merged in (nested dicts merged key by key)."""
    out = json.loads(json.dumps(base))
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merged(out[k], v)
        else:
            out[k] = json.loads(json.dumps(v))
    return out


def progress_lines(name: str, every_s: float = 10.0, out=None, run_for_s: float | None = None):
    """A Fleet.wait() progress callback: one line every `every_s` s (elapsed time, devices
    running, records stored on flash so far: each device's MQB-STORED lines); after
    `run_for_s`, how many devices are still draining their outbox. What was published is
    known when a device ends (its MQB-SUMMARY)."""
    t0 = time.monotonic()
    last = [t0]

    def progress(fleet: "Fleet") -> None:
        now = time.monotonic()
        if now - last[0] >= every_s:
            last[0] = now
            running, total = len(fleet.running()), len(fleet.procs)
            what = (
                f"sampling over, {running} of {total} devices still draining their outbox"
                if run_for_s is not None and now - t0 > run_for_s
                else f"{running} of {total} devices running"
            )
            print(
                f"{name}: {now - t0:5.0f} s, {what}, {len(fleet.stored())} records stored on flash so far",
                file=out or sys.stdout,
                flush=True,
            )

    return progress


def device_ids(count: int, prefix: str = "dev") -> list[str]:
    return [f"{prefix}-{i:03d}" for i in range(1, count + 1)]


def stored_in(console: str) -> set[tuple[int, int]]:
    """Every (boot, seq) whose batch a device's console reports on flash: its lines
    `MQB-STORED eid boot first last`. A line torn by SIGKILL (that batch may not be on
    flash) or not the firmware's (a field not a number) counts nothing."""
    keys: set[tuple[int, int]] = set()
    for line in console.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0] == "MQB-STORED" and all(p.isdigit() for p in parts[1:]):
            _, boot, first, last = (int(x) for x in parts[1:])
            keys.update((boot, s) for s in range(first, last + 1))
    return keys


class Fleet:
    def __init__(
        self,
        run_dir: os.PathLike | str,
        host: str,
        port: int,
        *,
        credentials: dict[str, str],
        ca: os.PathLike | str | None = None,
        tls: bool = True,
        server_hostname: str = "localhost",
        heapsize: str | None = DEFAULT_HEAP,
        config: dict | None = None,
        hmac_keys: dict[str, bytes] | None = None,
    ):
        self.run_dir = pathlib.Path(run_dir).resolve()
        private_dir(self.run_dir, tighten=True)  # flash directories hold passwords and outboxes: 0700
        self.credentials = dict(credentials)
        self.heapsize = heapsize
        self.firmware = self.run_dir / "firmware"
        compile_firmware("unix", self.firmware)
        self.image = self.run_dir / "firmware.romfs"
        with contextlib.redirect_stdout(io.StringIO()):  # make_romfs prints the tree
            build_image(self.firmware, self.image)
        self.procs: dict[str, subprocess.Popen] = {}
        for dev, password in self.credentials.items():
            d = self.dir(dev)
            private_dir(d, tighten=True)
            cfg = {
                "device_id": dev,
                "broker": {
                    "host": host,
                    "port": port,
                    "tls": tls,
                    "username": dev,
                    "password": password,
                    "server_hostname": server_hostname,
                },
            }
            if tls:
                if ca is None:
                    raise DeviceError(
                        "TLS needs the broker's CA certificate (`mqbatch devices --ca FILE`; ca= in Python)"
                    )
                write_private(d / "ca.pem", pathlib.Path(ca).read_bytes())
                cfg["broker"]["ca"] = "ca.pem"
            merged = _merged(DEVICE_DEFAULTS, config or {})
            merged.setdefault("broker", {}).update(cfg.pop("broker"))
            merged.update(cfg)
            if hmac_keys and dev in hmac_keys:
                merged["hmac_key"] = hmac_keys[dev].hex()  # batch-hmac key (docs/format.md)
            # the config holds the device's password (and hmac_key): readable by its owner only
            write_private(d / "config.json", json.dumps(merged, indent=1))
            write_private(d / "boot.py", (BOARDS / "unix" / "boot.py").read_bytes())

    def dir(self, dev: str) -> pathlib.Path:
        return self.run_dir / dev

    def start(self) -> "Fleet":
        for dev in self.credentials:
            self.start_device(dev)
        return self

    def start_device(self, dev: str) -> subprocess.Popen:
        old = self.procs.get(dev)
        if old is not None and old.poll() is None:
            raise DeviceError(f"{dev} is still running (pid {old.pid})")
        heap = self.heapsize
        cmd = (
            [sys.executable, "-m", "mqbatch.lab.romfs_run", str(self.image)]
            + (["-X", f"heapsize={heap}"] if heap else [])
            + ["-c", "import boot; import main"]
        )
        env = dict(os.environ, MICROPYPATH=".frozen")
        log = open(open_private(self.dir(dev) / "console.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab")
        try:
            self.procs[dev] = subprocess.Popen(
                cmd,
                cwd=self.dir(dev),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                umask=0o077,  # what the firmware writes (outbox, journal) is 0600 whatever our umask
            )
        finally:
            log.close()
        return self.procs[dev]

    def kill(self, dev: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs[dev]
        if p.poll() is None:
            p.send_signal(sig)
            p.wait(10)

    def running(self) -> list[str]:
        return [d for d, p in self.procs.items() if p.poll() is None]

    def wait(self, timeout: float, progress=None) -> dict[str, int]:
        """Wait for every device process to end; returns exit codes. Kills stragglers
        after timeout and raises DeviceError naming them."""
        deadline = time.monotonic() + timeout
        while self.running():
            if time.monotonic() > deadline:
                late = self.running()
                self.stop()
                raise DeviceError(f"devices still running after {timeout:.0f} s: {', '.join(late)}")
            if progress:
                progress(self)
            time.sleep(0.5)
        return {d: p.returncode for d, p in self.procs.items()}

    def stop(self) -> None:
        for p in self.procs.values():
            end_process(p, timeout=5)

    def console(self, dev: str) -> str:
        path = self.dir(dev) / "console.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def summaries(self) -> dict[str, dict]:
        """The last MQB-SUMMARY of each device (devices that never finished a run are absent)."""
        out = {}
        for dev in self.credentials:
            for line in self.console(dev).splitlines():
                if line.startswith("MQB-SUMMARY "):
                    out[dev] = json.loads(line[len("MQB-SUMMARY ") :])
        return out

    def stored(self) -> set[tuple[str, int, int]]:
        """Every (device, boot, seq) whose batch the device reported on flash (MQB-STORED)."""
        keys = set()
        for dev in self.credentials:
            keys.update((dev, boot, seq) for boot, seq in stored_in(self.console(dev)))
        return keys

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def from_fleet(root: str | os.PathLike, device_ids: list[str], run_dir: str | os.PathLike, **overrides) -> "Fleet":
    """The fleet's `unix` devices as virtual devices (the real firmware in the MicroPython
    Unix port, mqbatch.lab.devices.Fleet) with the config.json `add` wrote, `overrides`
    (e.g. run_for_s, sample_hz) merged in. Flash directories under run_dir."""
    from mqbatch.fleet.provision import FleetDir, FleetError, write_file

    fd = FleetDir(root)
    state = fd.load()
    configs = {}
    for dev in device_ids:
        entry = state["devices"].get(dev)
        if entry is None:
            raise FleetError(f"{dev} is not in the fleet {fd.root} (`mqbatch fleet add` it first)")
        if entry["board"] != "unix":
            raise FleetError(
                f"{dev} is an {entry['board']} device: only `unix` devices run here (mqbatch deploy the others)"
            )
        configs[dev] = json.loads((fd.root / entry["config"]).read_text(encoding="utf-8"))
    shared = dict(configs[device_ids[0]], **overrides)
    broker = shared.pop("broker")
    shared.pop("device_id")
    shared.pop("hmac_key", None)  # per device, below
    if len({(c["broker"]["port"], c["broker"]["client_cert"]) for c in configs.values()}) > 1:
        raise FleetError("run devices with client certificates and devices with passwords separately")
    shared["broker"] = {k: v for k, v in broker.items() if k not in ("username", "password", "ca")}
    devices = Fleet(
        run_dir,
        broker["host"],
        broker["port"],
        ca=fd.ca_cert,
        server_hostname=broker["server_hostname"],
        credentials={dev: cfg["broker"]["password"] for dev, cfg in configs.items()},
        config=shared,
        hmac_keys={dev: bytes.fromhex(cfg["hmac_key"]) for dev, cfg in configs.items() if cfg.get("hmac_key")},
    )
    for dev in device_ids:
        for key, mode in (("client_cert", 0o644), ("client_key", 0o600)):
            name = configs[dev]["broker"][key]
            if name:
                write_file(devices.dir(dev) / name, (fd.device_dir(dev) / name).read_bytes(), mode)
    return devices
