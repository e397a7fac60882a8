# MicroPython tests of boards/rp2040/mqb_board.py (Raspberry Pi Pico W) in the Unix
# port, with the stand-ins for the rp2 port's machine/network in boards/fakes: the
# board module must never reconfigure the wireless chip's pins (GPIO23-25, GPIO29)
# while Wi-Fi is up, however long it samples.
import sys

sys.path[:0] = ["../../boards/fakes", "../../boards/rp2040", "../../boards/common"]
import rp2040_machine
import rp2040_network
sys.modules["machine"] = rp2040_machine
sys.modules["network"] = rp2040_network
from array import array

CFG = {"wifi": {"ssid": "s", "password": "p", "timeout_ms": 100}}


def _board(cfg):
    """A fresh mqb_board (rp2040) after init(cfg) and a Wi-Fi connect."""
    for name in ("mqb_board", "mqb_wifi"):
        sys.modules.pop(name, None)
    rp2040_machine.clear()
    for w in rp2040_network._wlans:
        w.active(False)
    import mqb_board
    assert mqb_board.NAME == "rp2040", mqb_board.__file__
    mqb_board.init(cfg)
    assert mqb_board.network_connect(cfg) and mqb_board.network_up()
    return mqb_board


def test_sampling_with_wifi_up_never_touches_the_wireless_pins():
    b = _board(CFG)
    values = array("i", bytes(4 * len(b.CHANNELS)))
    for i in range(1000):                     # 100 s at the default 10 Hz
        b.sample(values)
    assert rp2040_machine.violations == [], rp2040_machine.violations[:4]
    # no VSYS on the Pico W by default: temperature and RSSI only
    assert b.CHANNELS == (1, 4), b.CHANNELS
    assert 2600 <= values[0] <= 2800 and values[1] == -61, list(values)


def test_vsys_through_an_external_divider_on_gpio26_to_28():
    b = _board(dict(CFG, hw={"vsys_adc_pin": 26, "vsys_divider_x1000": 3000}))
    assert b.CHANNELS == (1, 3, 4), b.CHANNELS
    values = array("i", bytes(4 * len(b.CHANNELS)))
    for i in range(100):
        b.sample(values)
    assert values[1] == 1861 * 806 // 1000 * 3000 // 1000, list(values)   # 1.5 V at the pin, x3
    assert values[2] == -61
    assert rp2040_machine.violations == [], rp2040_machine.violations
    assert ("ADC(0)", 26, False) in rp2040_machine.touched     # configured in init, before Wi-Fi


def test_gpio29_or_another_wireless_pin_as_vsys_pin_is_refused():
    for pin in (29, 25, 3, 30, "26"):
        try:
            _board(dict(CFG, hw={"vsys_adc_pin": pin}))
        except ValueError as e:
            assert "GPIO26..28" in str(e), str(e)
        else:
            raise AssertionError("vsys_adc_pin %r accepted" % (pin,))


def test_the_fake_flags_a_wireless_pin_taken_while_wifi_is_up():
    """The instrument can fail: what the old board module did (Pin(25) high, Pin(29)
    input, ADC(3)) is recorded while a WLAN is active, and not while none is."""
    _board(CFG)
    m = rp2040_machine
    m.clear()
    m.Pin(25, m.Pin.OUT, value=1)
    m.Pin(29, m.Pin.IN)
    m.ADC(3).read_u16()
    m.Pin(22, m.Pin.OUT)                       # an ordinary pin: fine
    assert m.violations == [("Pin(25)", 25), ("Pin(29)", 29), ("ADC(3)", 29)], m.violations
    for w in rp2040_network._wlans:
        w.active(False)
    m.clear()
    m.ADC(29)
    assert m.violations == [], m.violations
