# rp2040_network: a stand-in for the rp2 port's `network` on a Pico W (CYW43 Wi-Fi),
# for tests of boards/rp2040 and boards/common/mqb_wifi.py in the Unix port
# (register with sys.modules["network"] = rp2040_network). rp2040_machine asks
# any_active() to tell when a pin change would hit the running Wi-Fi driver.
STA_IF = 0
AP_IF = 1
_wlans = []


def any_active():
    for w in _wlans:
        if w._active:
            return True
    return False


class WLAN:
    def __init__(self, interface=STA_IF):
        self._active = False
        self._connected = False
        self.rssi = -61
        _wlans.append(self)

    def active(self, on=None):
        if on is None:
            return self._active
        self._active = bool(on)
        if not on:
            self._connected = False

    def connect(self, ssid, password):
        if not self._active:
            raise OSError("WLAN not active")
        self._connected = True

    def disconnect(self):
        self._connected = False

    def isconnected(self):
        return self._connected

    def status(self, what=None):
        if what == "rssi":
            return self.rssi
        return 3 if self._connected else 0
