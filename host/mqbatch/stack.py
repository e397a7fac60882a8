"""A local, secured mqbatch stack on loopback, for `mqbatch devices` and the demo:
a CA with server certificate, one password per device, a recorder account, and a
Mosquitto with TLS, authentication and per-device ACLs (a device may write only
under mqbatch/<its username>/; the recorder may only read).

    stack = LocalStack(run_dir, device_ids(5))
    stack.broker.start()
    stack.credentials          # {"dev-001": "<random password>", ...}
    stack.recorder_login       # ("recorder", "<random password>")
    stack.baseline_login       # ("baseline", ...): may only write under baseline/
"""
from __future__ import annotations

import os
import pathlib
import secrets

from mqbatch.broker import Mosquitto
from mqbatch.pki import make_pki

RECORDER = "recorder"
BASELINE = "baseline"           # the umqtt.simple comparison client (mqbatch.baseline)


def acl_text(recorder: str = RECORDER, baseline: str = BASELINE) -> str:
    # `pattern` lines apply to every user: %u is the authenticated username, so a
    # device can only publish under its own name, whatever client id it claims.
    # The baseline client writes outside mqbatch/, where the recorder never reads.
    return (f"pattern write mqbatch/%u/telemetry\npattern write mqbatch/%u/status\n\n"
            f"user {recorder}\ntopic read mqbatch/#\n\nuser {baseline}\ntopic write {baseline}/#\n")


class LocalStack:
    def __init__(self, run_dir: os.PathLike | str, devices: list[str], *, port: int | None = None,
                 broker_options: dict | None = None):
        self.run_dir = pathlib.Path(run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.pki = make_pki(self.run_dir / "pki", clients=[RECORDER])
        self.credentials = {d: secrets.token_urlsafe(12) for d in devices}
        self.recorder_login = (RECORDER, secrets.token_urlsafe(12))
        self.baseline_login = (BASELINE, secrets.token_urlsafe(12))
        users = dict(self.credentials)
        users[RECORDER] = self.recorder_login[1]
        users[BASELINE] = self.baseline_login[1]
        opts = {"persistence": True, "extra": ["max_queued_messages 0"]}
        opts.update(broker_options or {})
        self.broker = Mosquitto(self.run_dir / "broker", port=port, certfile=self.pki.server.cert,
                                keyfile=self.pki.server.key, cafile=self.pki.ca_cert, allow_anonymous=False,
                                users=users, acl=acl_text(), **opts)

    @property
    def ca_cert(self) -> pathlib.Path:
        return self.pki.ca_cert
