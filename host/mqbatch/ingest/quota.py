"""Per-device byte quota of the recorder (issue 23.5): one account must not fill the
landing zone (one pushed 1.18 GB in 20 s). Mosquitto 2.0 has no per-client rate or
byte quota, so the recorder enforces one per device (the second level of the topic,
which the broker's ACL binds to the device's account).

A token bucket per device: `rate` payload bytes per second, up to `burst` bytes
saved up. A PUBLISH whose payload does not fit is refused: acknowledged to the
broker (or it would be redelivered forever) but not landed, and never acknowledged
end to end, so a device with an outbox keeps it and sends it again later
(docs/e2e-ack.md). Every refusal is counted (messages and bytes, per device).

    q = DeviceQuota(rate=1 << 20, burst=64 << 20)
    q.admit("dev-001", 65536, now)    # True: within the quota; False: refused (counted)
    q.refused, q.refused_bytes, q.by_device
"""

from __future__ import annotations

import collections

MAX_DEVICES = 65536  # buckets kept; the least recently seen is dropped beyond (it starts full again)
OTHER = "?"  # topics that are not mqbatch/<device>/... share one bucket


def device_of(topic: str) -> str:
    parts = topic.split("/", 2)
    return parts[1] if len(parts) == 3 and parts[0] == "mqbatch" and parts[1] else OTHER


class DeviceQuota:
    def __init__(self, rate: float, burst: float, max_devices: int = MAX_DEVICES):
        if rate <= 0 or burst <= 0:
            raise ValueError(f"quota rate and burst must be > 0 (got {rate}, {burst}); disable the quota instead")
        self.rate, self.burst, self.max_devices = float(rate), float(burst), max_devices
        self._buckets: collections.OrderedDict[str, list[float]] = collections.OrderedDict()  # device -> [tokens, t]
        self.refused = self.refused_bytes = 0
        self.by_device: collections.Counter[str] = collections.Counter()  # refused PUBLISHes per device

    def admit(self, device: str, size: int, now: float) -> bool:
        """Take `size` bytes from the device's bucket; False (and counted) if they do not fit."""
        b = self._buckets.get(device)
        if b is None:
            b = self._buckets[device] = [self.burst, now]
            if len(self._buckets) > self.max_devices:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(device)
            b[0] = min(self.burst, b[0] + (now - b[1]) * self.rate)
            b[1] = now
        if size <= b[0]:
            b[0] -= size
            return True
        self.refused += 1
        self.refused_bytes += size
        self.by_device[device] += 1
        return False
