"""The OASIS MQTT 5.0 normative statements of the CONNECT, PUBLISH, PUBACK, PUBREC, PUBREL,
PUBCOMP, PINGREQ and DISCONNECT sections (and the CONNACK / operational ones a client must
obey), with what this harness does about each: covered by a row
(mqbatch.conformance.requirements names the ids it checks) or not, with why.
"""

from __future__ import annotations

SERVER = "a server obligation: the harness tests a publisher (the broker is Mosquitto, not under test)"
NOT_ON_WIRE = "not observable on the wire"

# id -> (what it says, in short; why it is not checked, when no row names it)
STATEMENTS: dict[str, tuple[str, str]] = {
    "MQTT-3.1.0-1": ("the first packet from the client is CONNECT", ""),
    "MQTT-3.1.0-2": ("CONNECT only once per connection", ""),
    "MQTT-3.1.2-1": ("protocol name MQTT", ""),
    "MQTT-3.1.2-2": ("protocol version 5 (else 0x84 and close)", ""),
    "MQTT-3.1.2-3": ("CONNECT reserved flag 0", ""),
    "MQTT-3.1.2-4": ("Clean Start 1: client and server discard the session", ""),
    "MQTT-3.1.2-5": ("Clean Start 0 with a session: the server resumes", SERVER),
    "MQTT-3.1.2-6": ("Clean Start 0 without a session: the server creates one", SERVER),
    "MQTT-3.1.2-7": ("Will stored by the server", SERVER),
    "MQTT-3.1.2-8": ("Will published after the connection closes", SERVER),
    "MQTT-3.1.2-9": ("Will flag 1: Will Properties, Topic and Payload present", ""),
    "MQTT-3.1.2-10": ("Will removed once published or after DISCONNECT 0x00", SERVER),
    "MQTT-3.1.2-11": ("Will flag 0: Will QoS 0", ""),
    "MQTT-3.1.2-12": ("Will QoS 0, 1 or 2", ""),
    "MQTT-3.1.2-13": ("Will flag 0: Will Retain 0", ""),
    "MQTT-3.1.2-14": ("Will Retain 0: published unretained", SERVER),
    "MQTT-3.1.2-15": ("Will Retain 1: published retained", SERVER),
    "MQTT-3.1.2-16": ("User Name flag 0: no User Name", ""),
    "MQTT-3.1.2-17": ("User Name flag 1: User Name present", ""),
    "MQTT-3.1.2-18": ("Password flag 0: no Password", ""),
    "MQTT-3.1.2-19": ("Password flag 1: Password present", ""),
    "MQTT-3.1.2-20": ("Keep Alive: PINGREQ when nothing else is sent", ""),
    "MQTT-3.1.2-21": ("the Server Keep Alive replaces the client's", ""),
    "MQTT-3.1.2-22": ("server closes after 1.5 x Keep Alive", SERVER + " (used as the client's allowance)"),
    "MQTT-3.1.2-23": ("session state kept after the connection when Session Expiry > 0", ""),
    "MQTT-3.1.2-24": ("server: packets within the client's Maximum Packet Size", SERVER),
    "MQTT-3.1.2-25": ("server discards packets too large for the client", SERVER),
    "MQTT-3.1.2-26": ("server: Topic Alias within the client's maximum", SERVER),
    "MQTT-3.1.2-27": ("server: no Topic Alias when the client allows none", SERVER),
    "MQTT-3.1.2-28": ("server: no Response Information unless asked", SERVER),
    "MQTT-3.1.2-29": ("server: Reason String / User Properties only as asked", SERVER),
    "MQTT-3.1.2-30": (
        "with an Authentication Method, only AUTH/DISCONNECT before CONNACK",
        "Mosquitto 2.0 here has no enhanced authentication; mqbatch authenticates with passwords and "
        "certificates (BATCH-7-1)",
    ),
    "MQTT-3.1.3-1": ("CONNECT payload fields in order", ""),
    "MQTT-3.1.3-2": ("the Client Identifier identifies the session state", ""),
    "MQTT-3.1.3-3": ("Client Identifier present, first in the payload", ""),
    "MQTT-3.1.3-4": ("Client Identifier UTF-8", ""),
    "MQTT-3.1.3-5": ("server accepts 1-23 alphanumeric client ids", SERVER),
    "MQTT-3.1.3-6": ("server assigns an id to an empty one", SERVER),
    "MQTT-3.1.3-7": ("server returns the Assigned Client Identifier", SERVER),
    "MQTT-3.1.3-8": ("server rejects a client id with 0x85", SERVER),
    "MQTT-3.1.3-9": ("server: no Will when the client returns within the Will Delay", SERVER),
    "MQTT-3.1.3-10": ("server keeps the Will's User Property order", SERVER),
    "MQTT-3.1.3-11": ("Will Topic UTF-8", ""),
    "MQTT-3.1.3-12": ("User Name UTF-8", ""),
    "MQTT-3.1.4-1": ("server validates CONNECT", SERVER),
    "MQTT-3.1.4-2": ("server checks and authenticates", SERVER),
    "MQTT-3.1.4-3": ("server takes over an existing session", SERVER),
    "MQTT-3.1.4-4": ("server performs Clean Start", SERVER),
    "MQTT-3.1.4-5": ("server acknowledges CONNECT", SERVER),
    "MQTT-3.1.4-6": ("server processes nothing after a rejected CONNECT", SERVER),
    "MQTT-3.2.2-4": (
        "client without session state that gets Session Present 1 closes the connection",
        "needs a server that lies about Session Present; Mosquitto does not",
    ),
    "MQTT-3.2.2-5": ("client with session state that gets Session Present 0 discards it", ""),
    "MQTT-3.2.2-11": ("no PUBLISH above the server's Maximum QoS", ""),
    "MQTT-3.2.2-14": ("no RETAIN=1 under Retain Available 0", ""),
    "MQTT-3.2.2-15": ("no packet above the server's Maximum Packet Size", ""),
    "MQTT-3.2.2-17": ("no Topic Alias above the server's Topic Alias Maximum", ""),
    "MQTT-3.2.2-18": ("no Topic Alias when the server allows none", ""),
    "MQTT-3.2.2-21": ("the client uses the Server Keep Alive", ""),
    "MQTT-3.3.1-1": ("DUP=1 on a re-delivery", ""),
    "MQTT-3.3.1-2": ("DUP=0 at QoS 0", ""),
    "MQTT-3.3.1-3": ("server sets DUP independently of the incoming one", SERVER),
    "MQTT-3.3.1-4": ("no QoS 3", ""),
    **{
        f"MQTT-3.3.1-{i}": ("retained message handling by the server", SERVER + "; BATCH-5-1 checks Mosquitto's")
        for i in range(5, 14)
    },
    "MQTT-3.3.2-1": ("Topic Name present first, UTF-8", ""),
    "MQTT-3.3.2-2": ("no wildcard in a Topic Name", ""),
    "MQTT-3.3.2-3": ("server: topic matches the subscription", SERVER),
    "MQTT-3.3.2-4": ("server forwards the Payload Format Indicator", SERVER),
    "MQTT-3.3.2-5": ("server deletes expired messages", SERVER + "; BATCH-5-4 checks Mosquitto's"),
    "MQTT-3.3.2-6": ("server forwards the reduced Message Expiry", SERVER + "; BATCH-5-4 checks Mosquitto's"),
    "MQTT-3.3.2-7": (
        "a receiver does not carry Topic Aliases across connections",
        "a receiver obligation; the sender's side (an alias used before it was defined on this connection) "
        "is MQTT-TOPIC-ALIAS",
    ),
    "MQTT-3.3.2-8": ("no Topic Alias 0", ""),
    "MQTT-3.3.2-9": ("client: Topic Alias within the server's maximum", ""),
    "MQTT-3.3.2-10": ("client accepts aliases up to its own maximum", "a publisher that subscribes to nothing"),
    "MQTT-3.3.2-11": ("server: Topic Alias within the client's maximum", SERVER),
    "MQTT-3.3.2-12": ("server accepts aliases up to its maximum", SERVER),
    "MQTT-3.3.2-13": ("Response Topic UTF-8", ""),
    "MQTT-3.3.2-14": (
        "no wildcard in a Response Topic",
        "batch publishers send no Response Topic; a wildcard there is not checked yet",
    ),
    "MQTT-3.3.2-15": ("server forwards the Response Topic", SERVER),
    "MQTT-3.3.2-16": ("server forwards the Correlation Data", SERVER),
    "MQTT-3.3.2-17": ("server forwards User Properties", SERVER + "; BATCH-5-1 checks both batch properties arrive"),
    "MQTT-3.3.2-18": ("server keeps User Property order", SERVER),
    "MQTT-3.3.2-19": ("Content Type UTF-8", ""),
    "MQTT-3.3.2-20": ("server forwards the Content Type", SERVER),
    "MQTT-3.3.4-1": (
        "the receiver of a PUBLISH answers per its QoS",
        "the publisher receives no PUBLISH (it subscribes to nothing)",
    ),
    "MQTT-3.3.4-2": ("server: the maximum QoS of overlapping subscriptions", SERVER),
    "MQTT-3.3.4-3": ("server: Subscription Identifiers sent", SERVER),
    "MQTT-3.3.4-4": ("server: all Subscription Identifiers in one copy", SERVER),
    "MQTT-3.3.4-5": ("server: the matching Subscription Identifier per copy", SERVER),
    "MQTT-3.3.4-6": ("no Subscription Identifier in a client PUBLISH", ""),
    "MQTT-3.3.4-7": ("client: at most Receive Maximum QoS 1/2 PUBLISHes unacknowledged", ""),
    "MQTT-3.3.4-8": (
        "client: other packets not delayed by a full send quota",
        "partly: MQTT-KEEPALIVE fails a client that stops sending (no PINGREQ) while its quota is full "
        "(scenario keepalive-1); a delay shorter than the Keep Alive is not observable as a fault",
    ),
    "MQTT-3.3.4-9": ("server: Receive Maximum of the client", SERVER),
    "MQTT-3.3.4-10": ("server: other packets not delayed", SERVER),
    "MQTT-3.4.2-1": ("PUBACK Reason Code defined for PUBACK", ""),
    "MQTT-3.4.2-2": (
        "no PUBACK Reason String beyond the receiver's Maximum Packet Size",
        "the publisher sends no PUBACK (it receives no PUBLISH)",
    ),
    "MQTT-3.4.2-3": ("no PUBACK User Property beyond it", "the publisher sends no PUBACK"),
    "MQTT-3.5.2-1": ("PUBREC Reason Code defined for PUBREC", ""),
    "MQTT-3.5.2-2": ("no PUBREC Reason String beyond the Maximum Packet Size", "the publisher sends no PUBREC"),
    "MQTT-3.5.2-3": ("no PUBREC User Property beyond it", "the publisher sends no PUBREC"),
    "MQTT-3.6.1-1": ("PUBREL fixed header flags 0010", ""),
    "MQTT-3.6.2-1": ("PUBREL Reason Code defined for PUBREL", ""),
    "MQTT-3.6.2-2": ("no PUBREL Reason String beyond the Maximum Packet Size", ""),
    "MQTT-3.6.2-3": ("no PUBREL User Property beyond it", ""),
    "MQTT-3.7.2-1": ("PUBCOMP Reason Code defined for PUBCOMP", ""),
    "MQTT-3.7.2-2": ("no PUBCOMP Reason String beyond the Maximum Packet Size", "the publisher sends no PUBCOMP"),
    "MQTT-3.7.2-3": ("no PUBCOMP User Property beyond it", "the publisher sends no PUBCOMP"),
    "MQTT-3.12.4-1": ("server answers PINGREQ with PINGRESP", SERVER),
    "MQTT-3.14.0-1": ("server: no DISCONNECT before a successful CONNACK", SERVER),
    "MQTT-3.14.1-1": ("DISCONNECT reserved flags 0", ""),
    "MQTT-3.14.2-1": ("DISCONNECT Reason Code defined for DISCONNECT", ""),
    "MQTT-3.14.2-2": ("server: no Session Expiry in DISCONNECT", SERVER),
    "MQTT-3.14.2-3": ("no DISCONNECT Reason String beyond the Maximum Packet Size", ""),
    "MQTT-3.14.2-4": ("no DISCONNECT User Property beyond it", ""),
    "MQTT-3.14.4-1": ("nothing sent after DISCONNECT", ""),
    "MQTT-3.14.4-2": (
        "the sender of DISCONNECT closes the connection",
        "a client that keeps it open is closed by the server; seen as the connection's end, not a fault yet",
    ),
    "MQTT-3.14.4-3": ("server discards the Will on DISCONNECT 0x00", SERVER),
    "MQTT-4.3.1-1": ("QoS 0: DUP 0", ""),
    "MQTT-4.3.2-1": ("QoS 1: an unused Packet Identifier for a new message", ""),
    "MQTT-4.3.2-2": ("QoS 1: first transmission with DUP 0", ""),
    "MQTT-4.3.2-3": ("QoS 1: unacknowledged until PUBACK", ""),
    "MQTT-4.3.3-1": ("QoS 2: an unused Packet Identifier", ""),
    "MQTT-4.3.3-2": ("QoS 2: first transmission with DUP 0", ""),
    "MQTT-4.3.3-3": ("QoS 2: unacknowledged until PUBREC", ""),
    "MQTT-4.3.3-4": ("QoS 2: PUBREL after PUBREC < 0x80, same id", ""),
    "MQTT-4.3.3-5": ("QoS 2: PUBREL unacknowledged until PUBCOMP", ""),
    "MQTT-4.3.3-6": ("QoS 2: no PUBLISH resend after PUBREL", ""),
    "MQTT-4.3.3-7": ("QoS 2: no message expiry once sent", NOT_ON_WIRE),
    "MQTT-4.4.0-1": ("resend open PUBLISH/PUBREL on a resumed session, original ids, and only then", ""),
    "MQTT-4.4.0-2": (
        "no retransmission after PUBACK/PUBREC >= 0x80",
        "Mosquitto does not refuse batches in these scenarios; such a resend is MQTT-DUP's evidence when "
        "it happens (a DUP=1 on a closed id)",
    ),
    "MQTT-4.6.0-1": ("resends in the original order", ""),
    "MQTT-4.6.0-4": ("PUBRELs in the order of their PUBRECs", "not checked yet (PUBREL order is not tracked)"),
    "MQTT-4.9.0-1": ("the send quota starts at most at Receive Maximum", ""),
    "MQTT-4.9.0-2": ("no QoS > 0 PUBLISH at quota 0", ""),
    "MQTT-4.9.0-3": ("other packets go on at quota 0", "see MQTT-3.3.4-8"),
    "MQTT-1.5.4-1": ("UTF-8 well-formed", ""),
    "MQTT-1.5.4-2": ("no U+0000", ""),
    "MQTT-1.5.5-1": ("Variable Byte Integers minimal", ""),
    "MQTT-2.1.3-1": ("reserved fixed-header flags", ""),
    "MQTT-2.2.1-2": ("no Packet Identifier at QoS 0", ""),
    "MQTT-2.2.1-3": ("a non-zero unused Packet Identifier per new PUBLISH", ""),
    "MQTT-4.7.3-2": ("no U+0000 in topics", ""),
}


def coverage(requirements) -> list[tuple[str, str, str, str]]:
    """[(statement id, what, covered by rows or "-", why not)] in statement order."""
    rows: dict[str, list[str]] = {}
    for r in requirements:
        for sid in r.statements:
            rows.setdefault(sid, []).append(r.id)

    def key(sid):
        return [int(x) if x.isdigit() else 0 for x in sid[5:].replace("-", ".").split(".")]

    out = []
    for sid in sorted(set(STATEMENTS) | set(rows), key=key):
        what, why = STATEMENTS.get(sid, ("", ""))
        by = ", ".join(rows.get(sid, []))
        if not by and not why:
            why = "not checked"
        out.append((sid, what, by or "-", "" if by else why))
    return out
