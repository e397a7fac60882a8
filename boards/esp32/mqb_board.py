# mqb_board for ESP32 DevKitC-class boards (MicroPython esp32 port).
# Readings: on-die temperature (centi-degC, coarse), supply voltage through a
# resistor divider on an ADC pin (mV), Wi-Fi RSSI (dBm). Integers only.
import esp32
import machine
import mqb_wifi
# the Wi-Fi boards share their network and clock functions
from mqb_wifi import connect as network_connect, sync_time, time_synced, up as network_up  # noqa: F401

NAME = "esp32"
CHANNELS = (1, 3, 4)   # temperature, supply_voltage, rssi

_adc = [None]
_div = [2000]          # divider ratio x1000 (2000 = 1:2), from config


def init(cfg):
    hw = cfg.get("hw", {})
    pin = hw.get("vbat_adc_pin", 35)
    adc = machine.ADC(machine.Pin(pin))
    adc.atten(machine.ADC.ATTN_11DB)
    _adc[0] = adc
    _div[0] = hw.get("vbat_divider_x1000", 2000)
    mqb_wifi.wlan.active(True)


def _temperature_centi():
    if hasattr(esp32, "mcu_temperature"):          # S2/S3/C3: degC, int
        return esp32.mcu_temperature() * 100
    f = esp32.raw_temperature()                    # classic ESP32: degF, int
    return (f - 32) * 500 // 9


def sample(values):
    values[0] = _temperature_centi()
    # read_uv() is calibrated (eFuse) microvolts; scale by the divider, report mV
    values[1] = _adc[0].read_uv() // 1000 * _div[0] // 1000
    values[2] = mqb_wifi.rssi()


def flash_dir():
    return "/"


def reset(code=0):
    """Restart the board (code: the Unix port's exit status; ignored here)."""
    machine.reset()
