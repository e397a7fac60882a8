"""The per-record baseline: umqtt.simple, the usual MicroPython MQTT client (MQTT
3.1.1, one message per PUBLISH), sending the same telemetry records one per
PUBLISH, QoS 1, over TLS, in the MicroPython Unix port.

umqtt.simple is a baseline only: `fetch_umqtt()` takes the release from the
package index pip is configured with (PEP 691 simple API, sha256 checked) into
a scratch directory at run time; it is never copied into this repository. (pip
itself cannot install it: its sdist has no setup.py.)

`measure()` counts the bytes sent towards the broker through a relay for 0 and
for N records; (bytes(N) - bytes(0)) / N is the cost per record on the wire,
TLS records included, without the connection set-up.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pathlib
import re
import subprocess
import sys
import tarfile
import time
import urllib.request

from mqbatch.scenarios.netcut import Relay
from mqbatch.util.paths import micropython_exe
from mqbatch.wire import records

UMQTT = "micropython-umqtt.simple"


class BaselineUnavailable(RuntimeError):
    pass


def index_url() -> str:
    """The simple index pip uses: $PIP_INDEX_URL, `pip config` global.index-url, else pip's default."""
    url = os.environ.get("PIP_INDEX_URL", "")
    if not url:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True, text=True
        )
        url = proc.stdout.strip() if proc.returncode == 0 else ""
    if not url:
        from pip._internal.models.index import PyPI

        url = PyPI.simple_url
    return url.rstrip("/")


def fetch_umqtt(dest: os.PathLike | str) -> str:
    """Put umqtt/simple.py (and a `ussl` name for MicroPython's ssl, which this old
    release imports) under dest; return the version. Raises BaselineUnavailable."""
    dest = pathlib.Path(dest)
    project = re.sub(r"[-_.]+", "-", UMQTT).lower()
    req = urllib.request.Request(f"{index_url()}/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            files = json.load(r)["files"]
        sdists = [f for f in files if f["filename"].endswith(".tar.gz")]
        if not sdists:
            raise BaselineUnavailable(f"the index lists no sdist of {UMQTT}")
        version_of = lambda f: tuple(int(x) for x in re.findall(r"\d+", f["filename"].rsplit("-", 1)[1]))
        best = max(sdists, key=version_of)
        with urllib.request.urlopen(best["url"], timeout=30) as r:
            data = r.read()
    except (OSError, ValueError, KeyError) as e:
        raise BaselineUnavailable(f"{UMQTT} could not be fetched from the package index: {e}") from None
    want = best.get("hashes", {}).get("sha256")
    if not want or hashlib.sha256(data).hexdigest() != want:
        raise BaselineUnavailable(f"{best['filename']}: sha256 missing or not the index's")
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = next((m for m in tar.getmembers() if m.name.endswith("umqtt/simple.py")), None)
            if member is None:
                raise BaselineUnavailable(f"{best['filename']} has no umqtt/simple.py")
            (dest / "umqtt").mkdir(parents=True, exist_ok=True)
            (dest / "umqtt" / "simple.py").write_bytes(tar.extractfile(member).read())
    except tarfile.TarError as e:
        raise BaselineUnavailable(f"{best['filename']} is not a readable tar.gz: {e}") from None
    (dest / "ussl.py").write_text("from ssl import *  # old umqtt.simple imports ussl\n")
    return best["filename"][len(UMQTT) + 1 : -len(".tar.gz")]


# Runs in the MicroPython Unix port: connect with umqtt.simple over TLS, publish each
# record (hex on argv) as its own QoS 1 PUBLISH, disconnect. The password comes on
# stdin (a command line is readable by every local user); the client id is the
# username, the one the broker binds to this account (mqbatch.fleet.brokerconf).
_WORKER = """
import sys, ssl
from umqtt.simple import MQTTClient
host, port, ca, user, topic, n, rec = sys.argv[1:8]
pw = sys.stdin.readline().strip()
with open(ca, 'rb') as f:
    cadata = f.read()
c = MQTTClient(user, host, int(port), user=user, password=pw, ssl=True,
               ssl_params={'cert_reqs': ssl.CERT_REQUIRED, 'cadata': cadata, 'server_hostname': 'localhost'})
c.connect()
data = bytes.fromhex(rec)
for i in range(int(n)):
    c.publish(topic, data, qos=1)
c.disconnect()
print('BASELINE-DONE')
"""


def measure(work_dir: os.PathLike | str, stack, *, count: int = 200) -> dict:
    """Wire bytes per record of umqtt.simple publishing `count` records one per
    PUBLISH through a relay to the stack's broker, as the stack's baseline user
    (topic baseline/umqtt, which the recorder does not read)."""
    work = pathlib.Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    version = fetch_umqtt(work / "lib")
    (work / "worker.py").write_text(_WORKER)
    ca_der = stack.pki.ca.cert_der  # this port's mbedTLS takes DER
    user, password = stack.baseline_login
    rec = records.encode_binary("sample", 1, 0, int(time.time() * 1000), [(1, 2150), (2, 4500), (3, 3300), (4, -55)])
    sent = {}
    for n in (0, count):
        relay = Relay(stack.broker.host, stack.broker.port).start()
        try:
            try:
                proc = subprocess.run(
                    [
                        str(micropython_exe()),
                        str(work / "worker.py"),
                        relay.host,
                        str(relay.port),
                        str(ca_der),
                        user,
                        f"{user}/umqtt",
                        str(n),
                        rec.hex(),
                    ],
                    env=dict(os.environ, MICROPYPATH=f".frozen:{work / 'lib'}"),
                    input=password + "\n",
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
            except subprocess.TimeoutExpired:
                raise BaselineUnavailable(f"umqtt.simple did not finish {n} publishes within 120 s") from None
            time.sleep(0.2)  # let the relay count the last bytes
        finally:
            relay.stop()
        if "BASELINE-DONE" not in proc.stdout:
            raise BaselineUnavailable(f"umqtt.simple run failed: {proc.stdout[-500:]} {proc.stderr[-800:]}")
        sent[n] = relay.bytes_up
    per_record = (sent[count] - sent[0]) / count
    return {
        "client": f"umqtt.simple {version}",
        "records": count,
        "record_bytes": len(rec),
        "connection_bytes": sent[0],
        "wire_bytes_per_record": per_record,
    }
