"""The network-cut relay of the demo, the baselines and the soak tool.

`Relay` is the inspecting proxy (mqbatch.conformance.proxy.Proxy): one relay in the project.
Devices connect to it instead of the broker. `cut()` drops every open
connection (as a lost Wi-Fi link does) and refuses new ones until `restore()`;
`bytes_up` / `bytes_down` count every byte relayed (TLS records included: the
true cost on the wire above TCP). TLS connections are relayed, not parsed.

    relay = Relay("127.0.0.1", broker.port).start()
    relay.port             # what devices connect to
    relay.cut(); ...; relay.restore()
"""

from __future__ import annotations

from mqbatch.conformance.proxy import Proxy as Relay

__all__ = ["Relay"]
