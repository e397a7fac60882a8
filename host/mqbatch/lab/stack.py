"""A local, secured mqbatch stack on loopback, for `mqbatch devices` and the demo:
a CA with server certificate, one password per device, a recorder account, and a
Mosquitto with TLS and the policy of mqbatch.fleet.brokerconf (each account bound to
its client id; a device may write only mqbatch/<its id>/telemetry and /status
and read only its acks mqbatch/<its id>/ack; the recorder may only join the
recorders' share group and publish acks; every size and queue
limited).

    stack = LocalStack(run_dir, device_ids(5))
    stack.broker.start()
    stack.credentials          # {"dev-001": "<random password>", ...}
    stack.recorder_login       # ("recorder", "<random password>"), client id RECORDER_CLIENT_ID
    stack.recorder_logins      # {client id: (username, password)}: LocalStack(..., recorders=2) adds
                               # "recorder-2" with client id "mqbatch-recorder-2" (a second member of the share group)
    stack.baseline_login       # ("baseline", ...): may only write under baseline/, client id "baseline"
    stack.policy               # the mqbatch.fleet.brokerconf.Policy in force
    stack.hmac_keys            # {"dev-001": <32 random bytes>, ...}: each device's batch-hmac key
    stack.hmac_keys_file       # the same as the Spark job's --hmac-keys file (run_dir/hmac-keys.json, 0600)
"""

from __future__ import annotations

import os
import pathlib
import secrets
from typing import TYPE_CHECKING

from mqbatch.fleet.brokerconf import LIMITS, RECORDER, RECORDER_CLIENT_ID, Limits, Policy  # noqa: F401 (re-exported)
from mqbatch.fleet.pki import make_pki
from mqbatch.lab.broker import Mosquitto
from mqbatch.util.private import private_dir
from mqbatch.wire.integrity import HMAC_KEY_BYTES, write_hmac_keys  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from mqbatch.lab.devices import Fleet

BASELINE = "baseline"  # the umqtt.simple comparison client (mqbatch.scenarios.baseline)


class LocalStack:
    def __init__(
        self,
        run_dir: os.PathLike | str,
        devices: list[str],
        *,
        port: int | None = None,
        broker_options: dict | None = None,
        limits: Limits = LIMITS,
        recorders: int = 1,
    ):
        self.run_dir = pathlib.Path(run_dir).resolve()
        private_dir(self.run_dir, tighten=True)
        self.pki = make_pki(self.run_dir / "pki", clients=[RECORDER])
        self.credentials = {d: secrets.token_urlsafe(12) for d in devices}
        self.hmac_keys = {d: secrets.token_bytes(HMAC_KEY_BYTES) for d in devices}
        self.hmac_keys_file = write_hmac_keys(self.run_dir / "hmac-keys.json", self.hmac_keys)
        self.recorder_login = (RECORDER, secrets.token_urlsafe(12))
        self.recorder_logins = {RECORDER_CLIENT_ID: self.recorder_login}
        for i in range(2, recorders + 1):
            self.recorder_logins[f"mqbatch-recorder-{i}"] = (f"{RECORDER}-{i}", secrets.token_urlsafe(12))
        self.baseline_login = (BASELINE, secrets.token_urlsafe(12))
        self.policy = Policy(limits=limits)
        for dev, password in self.credentials.items():
            self.policy.add_device(dev, password)
        for client_id, login in self.recorder_logins.items():
            self.policy.add_recorder(*login, client_id=client_id)
        self.policy.add_writer(*self.baseline_login)
        opts = {"persistence": True, **self.policy.broker_options()}
        opts.update(broker_options or {})
        self.broker = Mosquitto(
            self.run_dir / "broker",
            port=port,
            certfile=self.pki.server.cert,
            keyfile=self.pki.server.key,
            cafile=self.pki.ca_cert,
            **opts,
        )

    @property
    def ca_cert(self) -> pathlib.Path:
        return self.pki.ca_cert

    def fleet(self, run_dir: os.PathLike | str, host: str, port: int, *, signed: bool = True, **options) -> "Fleet":
        """Virtual devices (mqbatch.lab.devices.Fleet) with this stack's accounts and CA,
        connecting to host:port (the broker, or a relay in front of it); signed: with their
        batch-hmac keys, as `mqbatch fleet` provisions them. options: Fleet's (config, heapsize)."""
        from mqbatch.lab.devices import Fleet

        keys = self.hmac_keys if signed else None
        return Fleet(run_dir, host, port, credentials=self.credentials, ca=self.ca_cert, hmac_keys=keys, **options)
