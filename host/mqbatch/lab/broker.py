"""Run a real Mosquitto 2.0 broker on a loopback port with a generated config.

Used by the tests, the recorder's tests and the local demo. Nothing here mocks
the broker: `Mosquitto` writes ``mosquitto.conf`` (plus password and ACL files)
into a directory of its own, starts ``/usr/sbin/mosquitto -c mosquitto.conf``,
and waits until the listener accepts connections.

Example::

    from mqbatch.lab.broker import Mosquitto
    from mqbatch.fleet.pki import make_pki

    pki = make_pki(tmp / "pki")
    with Mosquitto(tmp / "broker", certfile=pki.server.cert, keyfile=pki.server.key,
                   cafile=pki.ca_cert, allow_anonymous=False,
                   users={"device-1": "secret"},
                   acl="user device-1\\ntopic write mqbatch/device-1/telemetry\\n",
                   max_packet_size=4096, persistence=True) as broker:
        broker.host, broker.port        # where to connect
        broker.stop(); broker.start()   # an outage: same port, sessions kept (persistence)
        broker.logs()                   # everything mosquitto printed so far

Options map one-to-one onto mosquitto.conf(5) keys; ``None`` means "leave
Mosquitto's default". Global keys: allow_anonymous, password_file (from
``users``), acl_file (from ``acl``), the dynamic-security plugin and its
config file (from ``dynamic_security``, a JSON document: see
mqbatch.fleet.brokerconf), max_packet_size, message_size_limit, max_queued_messages,
max_queued_bytes, max_inflight_messages, retain_available, persistence,
persistence_location (``<dir>/data/``), autosave_interval, autosave_on_changes.
Listener keys: the port, certfile/keyfile/cafile, tls_version, ciphers,
require_certificate, use_identity_as_username, use_username_as_clientid,
max_topic_alias, max_qos.

Every file written here that holds a secret or a policy (passwd, acl,
dynamic-security.json) is mode 0600: Mosquitto reads it as the same user
(the config's ``user`` line).
``extra`` lines are appended verbatim at the end (after the listener line, so
listener options are allowed there).

Mosquitto 2.0.11 behaviours seen by the tests (so nobody relies on the opposite):
it writes an MQTT 5 session to the persistence file only if that client's latest
CONNECT had Clean Start 0; it closes a taken-over or shut-down connection without
sending DISCONNECT 0x8E / 0x8B; it does not validate UTF-8 payloads sent with
Payload Format Indicator 1; it does not count the Remaining Length bytes against
max_packet_size.

Mosquitto started as root drops privileges; the config always names the
current user (``user root`` when run as root) so generated files stay readable.
Logging is ``log_type all`` to ``<dir>/mosquitto.log`` (log_dest file, flushed
per line; start-up errors printed before the log opens are appended to the
same file): every packet received
and sent is logged (e.g. ``Received PUBLISH from dev (d1, q1, r0, m3, 't', ... (120 bytes))``),
which tests use to check flags the subscriber cannot see, such as DUP.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pathlib
import pwd
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping

from mqbatch.util import private
from mqbatch.util.paths import DYNSEC_PLUGIN, MOSQUITTO  # noqa: E402  (where Debian installs them)
from mqbatch.util.procs import tail_lines

HOST = "127.0.0.1"


class BrokerError(RuntimeError):
    """Mosquitto could not be configured, started or stopped; the message says why
    and includes the tail of its log."""


def free_port(host: str = HOST) -> int:
    """A TCP port on `host` that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def password_line(username: str, password: str, iterations: int = 101) -> str:
    """One password_file line in Mosquitto 2.0's own format ($7$ = PBKDF2-SHA512),
    the same format `mosquitto_passwd -b` writes."""
    if ":" in username or "\n" in username or not username:
        raise ValueError(f"username {username!r} cannot be stored in a password_file (empty, ':' or newline)")
    salt = os.urandom(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode("utf-8"), salt, iterations)
    return f"{username}:$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def write_private(path: str | os.PathLike, text: str) -> pathlib.Path:
    """Write `text` to `path` readable and writable by its owner only (0600), also
    when the file already existed with wider permissions."""
    return private.write_private(path, text)


def _bool(v: bool) -> str:
    return "true" if v else "false"


class Mosquitto:
    """One Mosquitto process with a generated configuration in `directory`.

    Construction writes the files but does not start the broker; call start()
    or use it as a context manager (start on enter, stop on exit).

    Attributes: host, port, directory, conf_path, log_path, tls (bool),
    process (subprocess.Popen or None).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        port: int | None = None,
        certfile: str | os.PathLike | None = None,
        keyfile: str | os.PathLike | None = None,
        cafile: str | os.PathLike | None = None,
        require_certificate: bool | None = None,
        use_identity_as_username: bool | None = None,
        allow_anonymous: bool = True,
        users: Mapping[str, str] | None = None,
        acl: str | None = None,
        dynamic_security: Mapping | None = None,
        max_packet_size: int | None = None,
        message_size_limit: int | None = None,
        max_queued_messages: int | None = None,
        max_queued_bytes: int | None = None,
        tls_version: str | None = None,
        ciphers: str | None = None,
        use_username_as_clientid: bool | None = None,
        max_topic_alias: int | None = None,
        max_inflight_messages: int | None = None,
        max_qos: int | None = None,
        max_connections: int | None = None,
        retain_available: bool | None = None,
        persistence: bool = False,
        autosave_interval: int | None = None,
        autosave_on_changes: bool | None = None,
        extra: Iterable[str] = (),
        executable: str | os.PathLike = MOSQUITTO,
    ):
        self.directory = pathlib.Path(directory)
        private.private_dir(self.directory, tighten=True)
        self.host = HOST
        self._fixed_port = port is not None
        self.port = port if port is not None else free_port()
        self.conf_path = self.directory / "mosquitto.conf"
        self.log_path = self.directory / "mosquitto.log"
        self.executable = pathlib.Path(executable)
        self.process: subprocess.Popen | None = None
        self._log_file = None
        if (certfile is None) != (keyfile is None):
            raise BrokerError("TLS needs both certfile and keyfile (got only one)")
        self.tls = certfile is not None
        if (require_certificate or use_identity_as_username) and not self.tls:
            raise BrokerError("require_certificate/use_identity_as_username need a TLS listener (certfile, keyfile)")
        if require_certificate and cafile is None:
            raise BrokerError("require_certificate needs cafile (the CA that signed the client certificates)")
        if max_qos is not None and max_qos not in (0, 1, 2):
            raise BrokerError(f"max_qos must be 0, 1 or 2, got {max_qos}")

        glob = [
            f"user {pwd.getpwuid(os.geteuid()).pw_name}",
            f"log_dest file {self.log_path}",
            "log_type all",
            "connection_messages true",
            f"allow_anonymous {_bool(allow_anonymous)}",
        ]
        if users is not None:
            pw = write_private(self.directory / "passwd", "".join(password_line(u, p) + "\n" for u, p in users.items()))
            glob.append(f"password_file {pw}")
        if acl is not None:
            acl_path = write_private(self.directory / "acl", acl if acl.endswith("\n") else acl + "\n")
            glob.append(f"acl_file {acl_path}")
        if dynamic_security is not None:
            if not DYNSEC_PLUGIN.exists():
                raise BrokerError(f"the dynamic-security plugin {DYNSEC_PLUGIN} is missing (Debian package mosquitto)")
            ds = write_private(self.directory / "dynamic-security.json", json.dumps(dynamic_security, indent=1))
            glob += [f"plugin {DYNSEC_PLUGIN}", f"plugin_opt_config_file {ds}"]
        for key, value in (
            ("max_packet_size", max_packet_size),
            ("message_size_limit", message_size_limit),
            ("max_queued_messages", max_queued_messages),
            ("max_queued_bytes", max_queued_bytes),
        ):
            if value is not None:
                glob.append(f"{key} {int(value)}")
        if max_inflight_messages is not None:
            glob.append(f"max_inflight_messages {max_inflight_messages}")
        if retain_available is not None:
            glob.append(f"retain_available {_bool(retain_available)}")
        glob.append(f"persistence {_bool(persistence)}")
        if persistence:
            data = self.directory / "data"
            private.private_dir(data, tighten=True)
            glob.append(f"persistence_location {data}/")
            if autosave_interval is not None:
                glob.append(f"autosave_interval {autosave_interval}")
            if autosave_on_changes is not None:
                glob.append(f"autosave_on_changes {_bool(autosave_on_changes)}")
        self._global_lines = glob
        lst = []
        if self.tls:
            lst += [f"certfile {certfile}", f"keyfile {keyfile}"]
            if cafile is not None:
                lst.append(f"cafile {cafile}")
            if tls_version is not None:
                lst.append(f"tls_version {tls_version}")
            if ciphers is not None:
                lst.append(f"ciphers {ciphers}")
        elif tls_version is not None or ciphers is not None:
            raise BrokerError("tls_version/ciphers need a TLS listener (certfile, keyfile)")
        if require_certificate is not None:
            lst.append(f"require_certificate {_bool(require_certificate)}")
        if use_identity_as_username is not None:
            lst.append(f"use_identity_as_username {_bool(use_identity_as_username)}")
        if use_username_as_clientid is not None:
            lst.append(f"use_username_as_clientid {_bool(use_username_as_clientid)}")
        if max_topic_alias is not None:
            lst.append(f"max_topic_alias {max_topic_alias}")
        if max_qos is not None:
            lst.append(f"max_qos {max_qos}")
        if max_connections is not None:  # per listener (brokerconf.Limits.max_connections)
            lst.append(f"max_connections {int(max_connections)}")
        self._listener_lines = lst
        self._extra = list(extra)
        self._write_conf()

    # -- configuration --------------------------------------------------------

    def _write_conf(self) -> None:
        lines = (
            ["# generated by mqbatch.lab.broker.Mosquitto"]
            + self._global_lines
            + [f"listener {self.port} {self.host}"]
            + self._listener_lines
            + self._extra
        )
        private.write_private(self.conf_path, "\n".join(lines) + "\n")

    @property
    def config(self) -> str:
        """The mosquitto.conf text in use."""
        return self.conf_path.read_text()

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"

    # -- lifecycle ------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 15.0) -> "Mosquitto":
        """Start mosquitto and wait until it accepts TCP connections on (host, port).

        If the port was picked automatically and another process took it in the
        meantime, a new port is picked (first start only; restarts keep the port).
        Raises BrokerError with the log tail if mosquitto exits or does not listen."""
        if self.running:
            raise BrokerError(f"mosquitto already running on port {self.port} (pid {self.process.pid})")
        for attempt in range(5):
            try:
                self._start_once(timeout)
                return self
            except BrokerError as e:
                if self._fixed_port or "Address already in use" not in str(e) or attempt == 4:
                    raise
                self.port = free_port()
                self._write_conf()
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> None:
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._log_file = open(private.open_private(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab")
        self.process = subprocess.Popen(
            [str(self.executable), "-c", str(self.conf_path)],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.directory,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._close_log()
                raise BrokerError(
                    f"mosquitto exited with status {self.process.returncode} at start "
                    f"(port {self.port}):\n{tail_lines(self.logs(since=offset), path=self.log_path)}"
                )
            if " running" in self.logs(since=offset) and self._accepts():
                return
            time.sleep(0.05)
        self.kill()
        raise BrokerError(
            f"mosquitto did not listen on {self.host}:{self.port} within {timeout} s:\n"
            f"{tail_lines(self.logs(since=offset), path=self.log_path)}"
        )

    def _accepts(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self, timeout: float = 10.0) -> int | None:
        """Graceful stop (SIGTERM): mosquitto saves persistence and closes clients.
        Returns the exit status (None if it was not running)."""
        return self._end(signal.SIGTERM, timeout)

    def kill(self) -> int | None:
        """Abrupt stop (SIGKILL), as in a crash or power loss: nothing is saved
        beyond the last autosave."""
        return self._end(signal.SIGKILL, 10.0)

    def restart(self, timeout: float = 15.0) -> "Mosquitto":
        """stop() then start() on the same port, same config and persistence."""
        self.stop()
        self._fixed_port = True
        return self.start(timeout)

    def suspend(self) -> None:
        """Freeze the broker (SIGSTOP): TCP stays up but nothing is answered —
        a hung broker or a black-holed link, e.g. for keep-alive tests."""
        self._require_running().send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Undo suspend() (SIGCONT)."""
        self._require_running().send_signal(signal.SIGCONT)

    def _require_running(self) -> subprocess.Popen:
        if not self.running:
            raise BrokerError("mosquitto is not running")
        return self.process

    def _end(self, sig: int, timeout: float) -> int | None:
        proc = self.process
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a suspended process must run to handle SIGTERM
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self._close_log()
        self._fixed_port = True  # a later start() reuses this port
        return proc.returncode

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def logs(self, since: int = 0) -> str:
        """What mosquitto has logged (from byte offset `since`)."""
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(since)
            return f.read().decode("utf-8", "replace")

    def log_size(self) -> int:
        """Current log length: pass it to logs(since=...) to see only what follows."""
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def __enter__(self) -> "Mosquitto":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.process.pid}" if self.running else "stopped"
        return f"<Mosquitto {self.url} {state} dir={self.directory}>"
