# mqb_board for the Raspberry Pi Pico W (rp2 port, RP2040 + CYW43 Wi-Fi).
# Readings: internal temperature sensor on ADC 4 (centi-degC), VSYS on ADC 3
# (GPIO29, VSYS/3, mV), Wi-Fi RSSI (dBm). Integer arithmetic only, every
# intermediate value below 2**30 so nothing is allocated on this 32-bit port.
import machine
import mqb_wifi
# the Wi-Fi boards share their network and clock functions
from mqb_wifi import connect as network_connect, sync_time, time_synced, up as network_up  # noqa: F401

NAME = "rp2040"
CHANNELS = (1, 3, 4)   # temperature, supply_voltage, rssi

_temp_adc = machine.ADC(4)


def init(cfg):
    mqb_wifi.wlan.active(True)


def _temperature_centi():
    uv = (_temp_adc.read_u16() >> 4) * 806            # 12-bit reading, 3.3 V / 4096 = 806 uV per LSB
    # RP2040 datasheet: T = 27 - (V - 0.706) / 0.001721
    return 2700 - (uv - 706000) * 100 // 1721


def _vsys_mv():
    # On the Pico W, GPIO29 is shared with the CYW43 SPI clock: drive GPIO25
    # (wireless chip select) high while sampling VSYS/3 on ADC 3, then hand back.
    cs = machine.Pin(25, machine.Pin.OUT, value=1)
    machine.Pin(29, machine.Pin.IN, pull=None)
    raw = machine.ADC(3).read_u16() >> 4
    cs.init(machine.Pin.ALT, alt=7)
    machine.Pin(29, machine.Pin.ALT, alt=7)
    return raw * 806 * 3 // 1000


def sample(values):
    values[0] = _temperature_centi()
    values[1] = _vsys_mv()
    values[2] = mqb_wifi.rssi()


def flash_dir():
    return "/"


def reset(code=0):
    """Restart the board (code: the Unix port's exit status; ignored here)."""
    machine.reset()
