# mqb_board for the Raspberry Pi Pico W (rp2 port, RP2040 + CYW43439 Wi-Fi).
# Readings: internal temperature sensor on ADC 4 (centi-degC), Wi-Fi RSSI (dBm),
# and the supply voltage (mV) only through an external divider on GPIO26..28.
# Integer arithmetic only, every intermediate value below 2**30 so nothing is
# allocated on this 32-bit port.
#
# No VSYS on ADC3: on the Pico W, GPIO29 (ADC3, VSYS/3) is also the wireless
# chip's SPI clock and GPIO25 its chip select (Pico W datasheet, "Pico W-specific
# pins": VSYS can be read only when no SPI transaction is in progress). The SDK
# reads it under the CYW43 driver's lock (cyw43_thread_enter), which MicroPython
# does not expose, and its machine.ADC(3) re-muxes GPIO29 without that lock
# (micropython/micropython#10406). Switching the pins from Python while Wi-Fi
# runs can break a transfer at any sample, so this module never touches them
# (tests/mpy/mp_test_board_rp2040.py). To record the supply voltage, wire a
# divider from VSYS to GPIO26, 27 or 28 and set hw.vsys_adc_pin (and
# hw.vsys_divider_x1000, default 3000 = 1:3 like the Pico's own).
import machine
import mqb_wifi
# the Wi-Fi boards share their network and clock functions
from mqb_wifi import connect as network_connect, sync_time, time_synced, up as network_up  # noqa: F401

NAME = "rp2040"
CHANNELS = (1, 4)      # temperature, rssi; (1, 3, 4) with hw.vsys_adc_pin (supply_voltage)

_temp_adc = machine.ADC(4)   # the temperature sensor: an internal channel, no GPIO
_vsys = [None, 3000]         # ADC on the divider's pin, divider ratio x1000


def init(cfg):
    global CHANNELS
    hw = cfg.get("hw") or {}
    pin = hw.get("vsys_adc_pin")
    if pin is not None:
        if type(pin) is not int or not 26 <= pin <= 28:
            raise ValueError("hw.vsys_adc_pin %r: the supply voltage needs an external divider on GPIO26..28 "
                             "(GPIO29/ADC3 is the Wi-Fi chip's SPI clock on the Pico W)" % (pin,))
        div = hw.get("vsys_divider_x1000", 3000)
        if type(div) is not int or not 1000 <= div <= 100000:
            raise ValueError("hw.vsys_divider_x1000 %r: an int in 1000..100000" % (div,))
        _vsys[0] = machine.ADC(pin)       # before Wi-Fi starts; never reconfigured afterwards
        _vsys[1] = div
        CHANNELS = (1, 3, 4)
    else:
        _vsys[0] = None
        CHANNELS = (1, 4)
    mqb_wifi.wlan.active(True)


def _temperature_centi():
    uv = (_temp_adc.read_u16() >> 4) * 806            # 12-bit reading, 3.3 V / 4096 = 806 uV per LSB
    # RP2040 datasheet: T = 27 - (V - 0.706) / 0.001721
    return 2700 - (uv - 706000) * 100 // 1721


def sample(values):
    values[0] = _temperature_centi()
    adc = _vsys[0]
    if adc is None:
        values[1] = mqb_wifi.rssi()
        return
    values[1] = (adc.read_u16() >> 4) * 806 // 1000 * _vsys[1] // 1000   # mV at the pin x divider
    values[2] = mqb_wifi.rssi()


def flash_dir():
    return "/"


def reset(code=0):
    """Restart the board (code: the Unix port's exit status; ignored here)."""
    machine.reset()
