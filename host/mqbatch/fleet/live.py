"""Live provisioning (issue 26.3): `fleet add/remove` take effect on a running broker.

Mosquitto 2.0.11's dynamic-security plugin reads its file only at start: a SIGHUP
reloads mosquitto.conf but not the plugin's accounts (tried: a device added
before the SIGHUP is still refused, 0x87). So the fleet has one administration
account, `mqbatch-admin` (random password in DIR/admin/password, 0600), whose role
may only publish to the plugin's control topic `$CONTROL/dynamic-security/v1` and
read its answers on `.../response`. `fleet add/remove` write the plugin's file (for
the next start) and, if the broker is running, send the same change as plugin
commands (createRole + addRoleACL + createClient, setClientPassword on a rotation,
deleteClient + deleteRole on removal: the plugin disconnects a deleted client) and
check every answer. The plugin then saves its own state to the same file.

    send(host, port, cafile, password, commands)   # the plugin's answers, or LiveError
    device_commands(account, password, new=True)    # the commands for one device account
"""

from __future__ import annotations

import json
import ssl
import threading
import uuid

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from mqbatch.fleet.brokerconf import CONTROL_RESPONSE as RESPONSE
from mqbatch.fleet.brokerconf import CONTROL_TOPIC as CONTROL
from mqbatch.fleet.brokerconf import Account, _acls

ADMIN = "mqbatch-admin"
# answers that mean the broker already has what we asked for (it was started after the file was written)
ALREADY = ("already exists",)


class LiveError(RuntimeError):
    """The running broker could not be changed; `.unreachable` if no broker answered at all."""

    def __init__(self, text: str, unreachable: bool = False):
        super().__init__(text)
        self.unreachable = unreachable


def role_name(account: Account) -> str:
    """The plugin role of a non-recorder account (as brokerconf.Policy.dynamic_security names it)."""
    return f"{account.kind}:{account.username}"


def device_commands(account: Account, password: str | None, *, new: bool) -> list[dict]:
    """Plugin commands that give the running broker this device account (new) or its new password."""
    if not new:  # a certificate device has no password to set: its old certificate is revoked by the CRL
        return (
            []
            if password is None
            else [{"command": "setClientPassword", "username": account.username, "password": password}]
        )
    role = role_name(account)
    cmds: list[dict] = [{"command": "createRole", "rolename": role}]
    for acl in _acls(account):
        cmds.append({"command": "addRoleACL", "rolename": role, **acl})
    client = {
        "command": "createClient",
        "username": account.username,
        "clientid": account.client_id,
        "roles": [{"rolename": role}],
    }
    if password is not None:
        client["password"] = password
    cmds.append(client)
    return cmds


def removal_commands(username: str, role: str) -> list[dict]:
    return [{"command": "deleteClient", "username": username}, {"command": "deleteRole", "rolename": role}]


def send(host: str, port: int, cafile: str, password: str, commands: list[dict], timeout: float = 10.0) -> list[dict]:
    """Send `commands` to the broker's dynamic-security plugin as the admin account and
    return its answers (one per command). LiveError if the broker is unreachable
    (`.unreachable`), refuses the admin, or answers any command with an error other
    than "already exists"."""
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=ADMIN, protocol=mqtt.MQTTv5)
    c.tls_set(ca_certs=cafile, cert_reqs=ssl.CERT_REQUIRED)
    c.username_pw_set(ADMIN, password)
    corr = uuid.uuid4().hex
    state: dict = {}
    ready, answered = threading.Event(), threading.Event()

    def on_connect(client, userdata, flags, rc, props):
        state["connack"] = rc
        if rc.is_failure:
            ready.set()
            return
        client.subscribe(RESPONSE, qos=1)

    def on_subscribe(client, userdata, mid, rcs, props):
        state["suback"] = rcs[0]
        ready.set()

    def on_message(client, userdata, msg):
        try:
            doc = json.loads(msg.payload)
        except ValueError:
            return
        responses = doc.get("responses") or []
        if responses and all(r.get("correlationData") == corr for r in responses):
            state["responses"] = responses
            answered.set()

    c.on_connect, c.on_subscribe, c.on_message = on_connect, on_subscribe, on_message
    try:
        c.connect(host, port, keepalive=30)
    except (OSError, ssl.SSLError) as e:
        raise LiveError(f"no broker at {host}:{port} ({e})", unreachable=True) from None
    c.loop_start()
    try:
        if not ready.wait(timeout):
            raise LiveError(f"the broker at {host}:{port} did not answer the admin's CONNECT/SUBSCRIBE in {timeout} s")
        if state["connack"].is_failure:
            raise LiveError(f"the broker refused the admin account {ADMIN!r}: {state['connack']}")
        if state["suback"].is_failure:
            raise LiveError(f"the broker refused the admin's subscription to {RESPONSE}: {state['suback']}")
        body = {"commands": [dict(cmd, correlationData=corr) for cmd in commands]}
        c.publish(CONTROL, json.dumps(body), qos=1).wait_for_publish(timeout)
        if not answered.wait(timeout):
            raise LiveError(f"the dynamic-security plugin did not answer within {timeout} s")
    finally:
        c.disconnect()
        c.loop_stop()
    bad = [
        f"{r.get('command')}: {r['error']}"
        for r in state["responses"]
        if r.get("error") and not any(a in r["error"].lower() for a in ALREADY)
    ]
    if bad:
        raise LiveError("the broker refused: " + "; ".join(bad))
    return state["responses"]
