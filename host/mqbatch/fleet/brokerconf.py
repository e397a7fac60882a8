"""The broker's security policy, in one place: who may connect with which client
id, publish where, subscribe to what, and how big anything may be.

Used by mqbatch.lab.stack (`mqbatch demo`, `mqbatch devices`, the tests) and meant
for a fleet provisioning command: build a `Policy`, add one account per device
and per recorder, and hand `policy.broker_options()` to mqbatch.lab.broker.Mosquitto
(or write `policy.dynamic_security()` as the dynamic-security plugin's JSON file
of a production Mosquitto 2.0)::

    from mqbatch.fleet.brokerconf import Policy
    policy = Policy()                                   # group mqbatch-recorders, filter mqbatch/+/telemetry
    policy.add_device("dev-001", "pw-1")                # client id dev-001, writes mqbatch/dev-001/{telemetry,status}
    policy.add_recorder("recorder-1", "pw-r", client_id="mqbatch-recorder-1")
    broker = Mosquitto(run_dir, certfile=..., keyfile=..., cafile=..., **policy.broker_options())
    policy.accounts["dev-001"].client_id                # what the account must connect as

Mechanism (docs/security.md has the threat model and the tested matrix):

- Mosquitto's dynamic-security plugin does authentication and authorisation.
  Unlike acl_file, which lets every SUBSCRIBE through and checks `read` only
  when a message is delivered (so an intruder in the recorders' share group
  gets its round-robin share of telemetry, which is then dropped: lost), the
  plugin checks SUBSCRIBE itself and answers 0x87 Not authorized.
  Default access: nothing may be published, received or subscribed unless a
  role allows it.
- Each account has a fixed client id (the plugin's per-client ``clientid``):
  a CONNECT with any other id is refused (0x87), so nobody can take over
  another client's session. Devices: client id = username = device id.
- Each device has its own role: publish (send) only mqbatch/<id>/telemetry and
  mqbatch/<id>/status (its retained Will); subscribe to and receive only
  mqbatch/<id>/ack, its end-to-end acknowledgements (docs/e2e-ack.md). No device
  may publish to any ack topic.
- Each recorder has its own account (so that the client ids of two recorders
  can never collide) with the shared `recorder` role: subscribe exactly
  ``$share/<group>/<filter>`` (a literal: no other group, no plain filter,
  no ``#``, no ``$SYS``) and receive what matches the filter, and publish the
  end-to-end acknowledgements, ``mqbatch/+/ack``. Only recorder accounts can
  join the share group.
- `writer` accounts (the umqtt.simple baseline) may only publish under their
  own prefix, which no recorder reads.
- Nobody may publish to ``$CONTROL/dynamic-security/#`` except the one admin
  account `mqbatch fleet` makes for live provisioning (`add_admin`, mqbatch.fleet.live;
  the lab stack has none): its role may send plugin commands and read their answers,
  nothing else.
- Limits are sized from the batch limits of the format (spec section 3.3:
  100 records, 65536 payload bytes): see `Limits`.

Certificate identity (mutual TLS, the certificate CN as username): the plugin's
password check is not used for such clients, so `broker_options(cert_identity=True)`
also sets ``use_username_as_clientid``: the broker replaces whatever client id
a certificate client sends by its CN (so in that mode an account's client id is
its username; add accounts with password None). Tested in
tests/scenarios/test_security_matrix.py.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import os

MAX_BATCH_RECORDS = 100  # spec 3.3 max-batch-size
MAX_BATCH_PAYLOAD = 65536  # spec 3.3 max-total-batch-payload-size (bytes)
TOPIC_AND_PROPERTIES = 4096  # room for the topic, packet id and properties of one batch PUBLISH
RECORDER_GROUP = "mqbatch-recorders"
RECORDER = "recorder"  # the recorder's account
RECORDER_CLIENT_ID = "mqbatch-recorder-1"  # `mqbatch ingest`'s default --client-id
TELEMETRY_FILTER = "mqbatch/+/telemetry"
ACK_TOPICS = (
    "mqbatch/+/ack"  # end-to-end acknowledgements (docs/e2e-ack.md): recorders write, each device reads its own
)
TLS_VERSION = "tlsv1.2"  # minimum; TLS 1.3 is allowed too
# TLS 1.2 suites: forward secrecy and AEAD only (no CBC, no SHA-1 MAC). The server key is EC P-256.
TLS12_CIPHERS = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305"

DEVICE, RECORDER, WRITER, ADMIN = "device", "recorder", "writer", "admin"
CONTROL_TOPIC = "$CONTROL/dynamic-security/v1"  # the plugin's control topic (commands)
CONTROL_RESPONSE = f"{CONTROL_TOPIC}/response"  # its answers


@dataclasses.dataclass(frozen=True)
class Limits:
    """Every size and queue the broker enforces.

    message_size_limit: largest PUBLISH payload accepted; a bigger one is refused
      (QoS 1: Mosquitto 2.0.11 answers PUBACK 0x95, nothing is forwarded).
    max_packet_size: largest packet accepted (payload + topic + properties);
      a bigger one closes the sender's connection (DISCONNECT 0x95). This also
      bounds the user properties of one PUBLISH (at most ~14,000 empty ones),
      which is what keeps a hostile PUBLISH from stalling a recorder.
    max_queued_messages / max_queued_bytes: per client, what the broker keeps
      for a subscriber beyond its in-flight window (a recorder that is down).
      Beyond them Mosquitto drops new messages for that client (and still
      PUBACKs the sender): size them for the longest recorder outage you must
      survive (bytes / fleet rate).
    max_connections: per listener, the most clients Mosquitto holds at once (it
      accepts and closes at once anything over it). Bounds the broker's descriptors
      and memory (an idle TLS connection costs it ~50 KB: docs/security.md), and
      stays below the descriptor limit of the service (LimitNOFILE of the generated
      unit), so the broker never runs out of descriptors.
    per_source_connections: the most TCP connections one source address (IPv4, or
      IPv6 /64) may hold to a broker port, enforced in front of Mosquitto by the
      generated nftables rules (`firewall_rules`): Mosquitto 2.0 has no per-source
      limit and no deadline for a connection that never sends CONNECT (it drops it
      after 1.5 x its default keep-alive of 60 s), so without them one source that
      opens connections and sends nothing locks every device out.
    per_source_new_per_minute: new connections per minute one source may open
      (burst: per_source_connections); beyond it, SYNs are refused.
    """

    message_size_limit: int = MAX_BATCH_PAYLOAD
    max_packet_size: int = MAX_BATCH_PAYLOAD + TOPIC_AND_PROPERTIES
    max_queued_messages: int = 100_000
    max_queued_bytes: int = 512 << 20
    max_connections: int = 10_000
    per_source_connections: int = 64
    per_source_new_per_minute: int = 120

    @property
    def recorder_max_packet_size(self) -> int:
        """The Maximum Packet Size a recorder sends in CONNECT: at least what the
        broker can forward (Mosquitto 2.0.11 accepts packets a few bytes over its
        max_packet_size, it does not count the Remaining Length), so nothing the
        broker accepted is ever too big for a recorder (the broker would drop it)."""
        return self.max_packet_size + 1024


LIMITS = Limits()


@dataclasses.dataclass(frozen=True)
class Account:
    """One login. password None: certificate identity only (the CN is the username)."""

    username: str
    password: str | None
    client_id: str
    kind: str  # DEVICE, RECORDER or WRITER
    publish: tuple[str, ...] = ()  # topics it may send
    subscribe: tuple[str, ...] = ()  # exact subscription filters it may make
    receive: tuple[str, ...] = ()  # topic patterns it may be sent


def _check_name(what: str, name: str) -> None:
    if not name or any(c in name for c in "/+#:\n\0") or name.startswith("$"):
        raise ValueError(f"{what} {name!r} is not usable (empty, starts with '$', or has '/', '+', '#', ':')")


def password_hash(password: str, iterations: int = 101) -> dict:
    """The plugin's stored form: PBKDF2-SHA512, 12 random salt bytes, base64."""
    salt = os.urandom(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode("utf-8"), salt, iterations)
    return {
        "password": base64.b64encode(digest).decode(),
        "salt": base64.b64encode(salt).decode(),
        "iterations": iterations,
    }


def _acls(a: Account) -> list[dict]:
    """The plugin's ACL entries of an account: subscriptions are literal (no wildcard
    subscription grants more than the exact filter), publish/receive are patterns."""
    return (
        [{"acltype": "publishClientSend", "topic": t, "priority": 0, "allow": True} for t in a.publish]
        + [{"acltype": "subscribeLiteral", "topic": t, "priority": 0, "allow": True} for t in a.subscribe]
        + [{"acltype": "publishClientReceive", "topic": t, "priority": 0, "allow": True} for t in a.receive]
    )


class Policy:
    """Accounts and limits of one broker. Add accounts, then call broker_options()."""

    def __init__(self, *, group: str = RECORDER_GROUP, topic_filter: str = TELEMETRY_FILTER, limits: Limits = LIMITS):
        _check_name("share group", group)
        self.group, self.topic_filter, self.limits = group, topic_filter, limits
        self.accounts: dict[str, Account] = {}

    @property
    def share_subscription(self) -> str:
        """The one subscription recorders may make."""
        return f"$share/{self.group}/{self.topic_filter}"

    def _add(self, account: Account) -> Account:
        _check_name("username", account.username)
        _check_name("client id", account.client_id)
        if account.username in self.accounts:
            raise ValueError(f"account {account.username!r} exists already")
        taken = {a.client_id: a.username for a in self.accounts.values()}
        if account.client_id in taken:
            raise ValueError(f"client id {account.client_id!r} belongs to account {taken[account.client_id]!r}")
        self.accounts[account.username] = account
        return account

    def add_device(self, device_id: str, password: str | None) -> Account:
        """A device: client id = username = device_id; writes only its own telemetry and
        status topics, reads only its own ack topic."""
        ack = f"mqbatch/{device_id}/ack"
        return self._add(
            Account(
                device_id,
                password,
                device_id,
                DEVICE,
                publish=(f"mqbatch/{device_id}/telemetry", f"mqbatch/{device_id}/status"),
                subscribe=(ack,),
                receive=(ack,),
            )
        )

    def add_recorder(self, username: str, password: str | None, client_id: str | None = None) -> Account:
        """A recorder: its own account; joins the share group and publishes the acks, nothing else."""
        return self._add(
            Account(
                username,
                password,
                client_id or username,
                RECORDER,
                publish=(ACK_TOPICS,),
                subscribe=(self.share_subscription,),
                receive=(self.topic_filter,),
            )
        )

    def add_admin(self, username: str, password: str | None, client_id: str | None = None) -> Account:
        """The one administration account (`mqbatch fleet`'s live provisioning, mqbatch.fleet.live):
        publishes plugin commands on CONTROL_TOPIC and reads the answers; nothing else."""
        return self._add(
            Account(
                username,
                password,
                client_id or username,
                ADMIN,
                publish=(CONTROL_TOPIC,),
                subscribe=(CONTROL_RESPONSE,),
                receive=(CONTROL_RESPONSE,),
            )
        )

    def add_writer(self, username: str, password: str | None, client_id: str | None = None) -> Account:
        """A writer outside mqbatch/ (the baseline client): publishes under <username>/ only."""
        return self._add(Account(username, password, client_id or username, WRITER, publish=(f"{username}/#",)))

    # -- outputs ---------------------------------------------------------------------
    def dynamic_security(self) -> dict:
        """The dynamic-security plugin's JSON document (holds password hashes: write it 0600)."""
        roles, clients = [], []
        recorders = [a for a in self.accounts.values() if a.kind == RECORDER]
        if recorders:  # one shared role: every recorder account has the same rights
            roles.append({"rolename": "recorder", "acls": _acls(recorders[0])})
        for a in self.accounts.values():
            if a.kind == RECORDER:
                rolename = "recorder"
            else:
                rolename = f"{a.kind}:{a.username}"
                roles.append({"rolename": rolename, "acls": _acls(a)})
            client = {"username": a.username, "clientid": a.client_id, "roles": [{"rolename": rolename}]}
            if a.password is not None:
                client.update(password_hash(a.password))
            clients.append(client)
        return {
            "defaultACLAccess": {
                "publishClientSend": False,
                "publishClientReceive": False,
                "subscribe": False,
                "unsubscribe": True,
            },
            "clients": clients,
            "groups": [],
            "roles": roles,
        }

    def broker_options(
        self, *, cert_identity: bool = False, save_every_change: bool = False, payload_limit: bool = True
    ) -> dict:
        """Keyword arguments for mqbatch.lab.broker.Mosquitto: the plugin, the limits, TLS
        versions/suites, no anonymous access. cert_identity: the listener authenticates
        by client certificate (CN = username) and binds the client id to it.
        save_every_change: with persistence, write the whole in-memory database after
        every change (autosave_on_changes, autosave_interval 1) so that a broker crash
        loses less of what it acknowledged (not fsync'd: not a guarantee; end-to-end acks,
        docs/e2e-ack.md, are). Off by default: Mosquitto 2.0.11 counts a message queued for
        an offline client as a change and rewrites the whole database after each loop that
        had one, so during a recorder outage the broker slows down as its queue grows
        (measured, docs/fleet.md: 196 instead of 8,687 PUBLISH/s with 1,000 queued, ~35 at
        3,500).
        payload_limit: also `message_size_limit` (a payload over the batch limit is refused
        with PUBACK 0x95). Mosquitto 2.0.11 prints a deprecation note at every start when it
        is set ("It is recommended to replace `message_size_limit` with `max_packet_size`"):
        `mqbatch fleet` leaves it out (max_packet_size bounds every packet; a payload
        between the two limits is landed and quarantined by the Spark job with its reason)."""
        opts = {
            "allow_anonymous": False,
            "dynamic_security": self.dynamic_security(),
            "message_size_limit": self.limits.message_size_limit,
            "max_packet_size": self.limits.max_packet_size,
            "max_queued_messages": self.limits.max_queued_messages,
            "max_queued_bytes": self.limits.max_queued_bytes,
            "max_connections": self.limits.max_connections,
            "tls_version": TLS_VERSION,
            "ciphers": TLS12_CIPHERS,
        }
        if not payload_limit:
            del opts["message_size_limit"]
        if save_every_change:
            opts.update(autosave_on_changes=True, autosave_interval=1)
        if cert_identity:
            opts.update(require_certificate=True, use_identity_as_username=True, use_username_as_clientid=True)
        return opts


FIREWALL_TABLE = "mqbatch_broker"


def firewall_rules(ports: list[int], limits: Limits = LIMITS, table: str = FIREWALL_TABLE) -> str:
    """nftables rules (``nft -f FILE``) that bound what one source can hold on the
    broker's ports: at most limits.per_source_connections TCP connections per IPv4
    address or IPv6 /64 (conntrack count), and at most
    limits.per_source_new_per_minute new connections per minute per source; beyond
    either, the SYN is answered with a TCP reset. Own table: applying the file
    replaces only this table (it deletes it first), not the host's other rules."""
    if not ports or not all(isinstance(p, int) and 1 <= p <= 65535 for p in ports):
        raise ValueError(f"ports {ports!r}: give the broker's TCP listener ports (1-65535)")
    if not table.replace("_", "").isalnum():
        raise ValueError(f"nftables table name {table!r}: letters, digits and '_' only")
    dports = "{ " + ", ".join(str(p) for p in sorted(set(ports))) + " }"
    n, rate = limits.per_source_connections, limits.per_source_new_per_minute
    return f"""\
# mqbatch broker: per-source connection limits (generated; see docs/fleet.md, "Connection limits").
# Apply: nft -f THIS_FILE   (as root; replaces only table inet {table}). Check: nft list table inet {table}
table inet {table}
delete table inet {table}
table inet {table} {{
	set conn4 {{ type ipv4_addr; size 65535; flags dynamic; }}
	set conn6 {{ type ipv6_addr; size 65535; flags dynamic; }}
	set new4 {{ type ipv4_addr; size 65535; flags dynamic,timeout; timeout 2m; }}
	set new6 {{ type ipv6_addr; size 65535; flags dynamic,timeout; timeout 2m; }}
	chain input {{
		type filter hook input priority filter; policy accept;
		tcp dport {dports} ct state new add @conn4 {{ ip saddr ct count over {n} }} counter reject with tcp reset
		tcp dport {dports} ct state new add @conn6 {{ ip6 saddr and ffff:ffff:ffff:ffff:: ct count over {n} }} counter reject with tcp reset
		tcp dport {dports} ct state new update @new4 {{ ip saddr limit rate over {rate}/minute burst {n} packets }} counter reject with tcp reset
		tcp dport {dports} ct state new update @new6 {{ ip6 saddr and ffff:ffff:ffff:ffff:: limit rate over {rate}/minute burst {n} packets }} counter reject with tcp reset
	}}
}}
"""
