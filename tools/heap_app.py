"""What the device application holds in the heap after start-up (docs/application.md, Memory).

The firmware as .mpy in a ROMFS image (mqbatch.lab.devices.Fleet's build: bytecode outside the
heap), `micropython -X heapsize=256K`, main.py's order (gc.threshold, the two batch buffers
and the TLS context first), then `import mqb_app` and `App(cfg)`; gc.mem_alloc() after
gc.collect() at each point. The broker is a closed loopback port (App() does not connect).

    .venv/bin/python tools/heap_app.py [--config '{"e2e_ack": {"enabled": true}}'] [--runs 3]
        [--files] [--port unix|wasm32]

--files: the .mpy files in the device's directory instead, as `mqbatch deploy`
installs them on a board's filesystem: their bytecode is loaded into the heap.
--port wasm32: in the 32-bit WebAssembly port (tests/mpy32/run_wasm32.mjs; implies
--files: that port has no ROMFS), with a stand-in `tls` that holds nothing (the port
has none): the TLS context's own heap is not in its figures. "#-- call" lines split
the script into separate top-level calls there (run_wasm32.mjs --calls); comments elsewhere.

Prints one line per run: imports, App, live after start-up (bytes), the modules loaded,
and micropython.qstr_info() (interned names: a full pool makes the next name cost a new
pool of several KB). A config key "_probe_imports": ["mqb_codec", ...] imports those
modules one at a time first and prints what each added (IMPORT lines).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]

from mqbatch.fleet.deploy import compile_firmware  # noqa: E402
from mqbatch.fleet.pki import make_ca  # noqa: E402
from mqbatch.lab.devices import DEVICE_DEFAULTS, _merged  # noqa: E402
from mqbatch.lab.romfs_run import build_image  # noqa: E402
from mqbatch.util.paths import micropython_exe  # noqa: E402

SCRIPT = """
import gc
gc.threshold(4096)
import json, sys
with open("config.json") as f:
    cfg = json.load(f)
size = cfg["flush"]["max_bytes"] + 160
buffers = (bytearray(size), bytearray(size))
import tls
ctx = tls.SSLContext(tls.PROTOCOL_TLS_CLIENT)
#-- call
gc.collect()
a0 = gc.mem_alloc()
a1 = a0
for m in cfg.get("_probe_imports", ()):     # modules one at a time, in this order, before mqb_app
    __import__(m)
    gc.collect()
    print("IMPORT", m, gc.mem_alloc() - a1)
    a1 = gc.mem_alloc()
cfg.pop("_probe_imports", None)     # not a config key (mqb_config refuses unknown keys)
import mqb_app
#-- call
gc.collect()
a1 = gc.mem_alloc()

def start():
    # as mqb_app.main() does, in a function: a reference the script's own VM stack keeps
    # (to the config module or dict) is gone before the measurement. make_config is
    # mqb_config's, unloaded before App() (mqb_app's before the split of issue 20 item 3)
    make = getattr(mqb_app, "make_config", None)
    if make is None:
        import mqb_config
        c = mqb_config.make_config(cfg)
        del mqb_config
        sys.modules.pop("mqb_config", None)
    else:
        c = make(cfg)
    return mqb_app.App(c, buffers=buffers, ssl_context=ctx)
app = start()
#-- call
gc.collect()
a2 = gc.mem_alloc()
import micropython
micropython.qstr_info()
mods = sorted(k for k in sys.modules if k.startswith("mqb_"))
print("HEAP", json.dumps({"before_imports": a0, "imports": a1 - a0, "app": a2 - a1, "live": a2, "modules": mods}))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="{}", help="JSON merged over the device defaults")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--heapsize", default="256K")
    ap.add_argument("--files", action="store_true", help=".mpy files on the filesystem (bytecode in the heap)")
    ap.add_argument("--port", choices=("unix", "wasm32"), default="unix")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mqb-heap-") as tmp:
        tmp = pathlib.Path(tmp)
        compile_firmware("unix", tmp / "fw")
        with contextlib.redirect_stdout(io.StringIO()):
            build_image(tmp / "fw", tmp / "fw.romfs")
        dev = tmp / "dev"
        dev.mkdir()
        (tmp / "pki").mkdir()
        ca = make_ca(tmp / "pki", "mqbatch heap probe")  # TLS configured (the CA is loaded by App())
        (dev / "ca.pem").write_bytes(ca.cert.read_bytes())
        cfg = _merged(DEVICE_DEFAULTS, json.loads(args.config))
        cfg.update(device_id="dev-001")
        cfg.setdefault("broker", {}).update(
            host="127.0.0.1",
            port=1,
            tls=True,
            ca="ca.pem",
            username="dev-001",
            password="pw",
            server_hostname="localhost",
        )
        (dev / "config.json").write_text(json.dumps(cfg))
        (dev / "boot.py").write_text((ROOT / "boards" / "unix" / "boot.py").read_text())
        (dev / "measure.py").write_text(SCRIPT)
        for _ in range(args.runs):
            proc = _run(args, tmp, dev)
            line = [x for x in proc.stdout.splitlines() if x.startswith("HEAP ")]
            for x in proc.stdout.splitlines():
                if x.startswith("IMPORT ") or x.startswith("qstr"):
                    print(x)
            if proc.returncode or not line:
                print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
                return 1
            print(line[0])
    return 0


def _run(args, tmp: pathlib.Path, dev: pathlib.Path) -> subprocess.CompletedProcess:
    if args.port == "wasm32":
        runner = ROOT / "tests" / "mpy32" / "run_wasm32.mjs"
        base = pathlib.Path(os.environ.get("MQBATCH_WASM32") or pathlib.Path(sys.prefix) / "wasm32")  # bootstrap.sh
        pkg = base / "node_modules" / "@micropython" / "micropython-webassembly-pyscript"
        cmd = ["node", str(runner), str(pkg), "--tls-stub", "--put", f"{tmp / 'fw'}=/flash"]
        cmd += ["--put", f"{dev}=/flash", "--path", "/flash", "--cwd", "/flash", "--calls", "/flash/measure.py"]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if args.files:
        for f in (tmp / "fw").iterdir():
            (dev / f.name).write_bytes(f.read_bytes())
        cmd = [str(micropython_exe()), "-X", f"heapsize={args.heapsize}", "-c", "import measure"]
        return subprocess.run(cmd, cwd=dev, env={"MICROPYPATH": "."}, capture_output=True, text=True, timeout=120)
    cmd = [sys.executable, "-m", "mqbatch.lab.romfs_run", str(tmp / "fw.romfs"), "-X", f"heapsize={args.heapsize}"]
    cmd += ["-c", "import boot; import measure"]
    env = {"MICROPYPATH": ".frozen"}
    if "PYTHONPATH" in os.environ:  # the launcher is the mqbatch imported here (a checkout's host/)
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run(cmd, cwd=dev, env=env, capture_output=True, text=True, timeout=120)


if __name__ == "__main__":
    sys.exit(main())
