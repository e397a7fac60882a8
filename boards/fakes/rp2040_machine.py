# rp2040_machine: a stand-in for the rp2 port's `machine` on a Raspberry Pi Pico W,
# for tests of boards/rp2040/mqb_board.py in the Unix port (register it with
# sys.modules["machine"] = rp2040_machine; the Unix port has its own `machine`).
#
# It watches the RP2040 pins wired to the CYW43439 wireless chip (Pico W datasheet,
# "Pico W-specific pins"): GPIO23 WL_ON, GPIO24 SPI data/IRQ, GPIO25 SPI chip
# select, GPIO29 SPI clock, which is also ADC3 (VSYS/3). Any Pin() / Pin.init() /
# ADC() that reconfigures one of them while a WLAN interface is active is recorded
# in `violations`: on the board that takes the pin away from the running Wi-Fi
# driver (MicroPython's machine.ADC(3) re-muxes GPIO29 to the ADC without the
# driver's lock).
WIRELESS_PINS = (23, 24, 25, 29)
violations = []     # (what, gpio) taken while Wi-Fi was active
touched = []        # (what, gpio, wifi_active) for every pin configured


def _wifi_active():
    import sys
    net = sys.modules.get("network")
    return bool(net is not None and net.any_active())


def _touch(what, gpio):
    active = _wifi_active()
    touched.append((what, gpio, active))
    if gpio in WIRELESS_PINS and active:
        violations.append((what, gpio))


def clear():
    del violations[:]
    del touched[:]


class Pin:
    IN = 0
    OUT = 1
    OPEN_DRAIN = 2
    ALT = 3
    PULL_UP = 1
    PULL_DOWN = 2

    def __init__(self, gpio, mode=-1, pull=-1, value=None, alt=-1):
        self.id = gpio
        self._v = 0 if value is None else value
        _touch("Pin(%d)" % gpio, gpio)

    def init(self, mode=-1, pull=-1, value=None, alt=-1):
        _touch("Pin(%d).init" % self.id, self.id)

    def value(self, v=None):
        if v is None:
            return self._v
        self._v = v


# read_u16() per ADC channel: 0..2 GPIO26..28, 3 GPIO29 (VSYS/3), 4 the temperature sensor.
# 12-bit readings scaled to 16 bits like the rp2 port (raw << 4).
READINGS = {0: 1861 << 4, 1: 0, 2: 0, 3: 2048 << 4, 4: 876 << 4}


class ADC:
    CORE_TEMP = 4

    def __init__(self, source):
        ch = source.id if isinstance(source, Pin) else source
        if 26 <= ch <= 29:
            ch -= 26
        if not 0 <= ch <= 4:
            raise ValueError("invalid channel")
        if ch < 4:
            _touch("ADC(%d)" % ch, ch + 26)   # rp2: adc_gpio_init() re-muxes the pin to the ADC
        self.ch = ch

    def read_u16(self):
        return READINGS[self.ch]


def reset():
    raise SystemExit(1)
