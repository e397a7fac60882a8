# mqb_board for ESP32 DevKitC-class boards (MicroPython esp32 port).
# Readings: on-die temperature (centi-degC, coarse), supply voltage through a
# resistor divider on an ADC pin (mV), Wi-Fi RSSI (dBm). Integers only.
import esp32
import machine
import network
import os
import time

NAME = "esp32"
CHANNELS = (1, 3, 4)   # temperature, supply_voltage, rssi

_wlan = network.WLAN(network.STA_IF)
_adc = [None]
_div = [2000]          # divider ratio x1000 (2000 = 1:2), from config
_synced = [False]


def init(cfg):
    hw = cfg.get("hw", {})
    pin = hw.get("vbat_adc_pin", 35)
    adc = machine.ADC(machine.Pin(pin))
    adc.atten(machine.ADC.ATTN_11DB)
    _adc[0] = adc
    _div[0] = hw.get("vbat_divider_x1000", 2000)
    _wlan.active(True)


def _temperature_centi():
    if hasattr(esp32, "mcu_temperature"):          # S2/S3/C3: degC, int
        return esp32.mcu_temperature() * 100
    f = esp32.raw_temperature()                    # classic ESP32: degF, int
    return (f - 32) * 500 // 9


def sample(values):
    values[0] = _temperature_centi()
    # read_uv() is calibrated (eFuse) microvolts; scale by the divider, report mV
    values[1] = _adc[0].read_uv() // 1000 * _div[0] // 1000
    values[2] = _wlan.status("rssi") if _wlan.isconnected() else -127


def network_connect(cfg):
    w = cfg["wifi"]
    if _wlan.isconnected():
        return True
    _wlan.active(True)
    _wlan.connect(w["ssid"], w["password"])
    deadline = time.ticks_add(time.ticks_ms(), w.get("timeout_ms", 10000))
    while not _wlan.isconnected():
        if time.ticks_diff(deadline, time.ticks_ms()) <= 0:
            _wlan.disconnect()
            return False
        time.sleep_ms(100)
    return True


def network_up():
    return _wlan.isconnected()


def sync_time():
    import ntptime
    try:
        ntptime.settime()
    except OSError as e:
        print("mqb_board: NTP sync failed:", e)
        return _synced[0]
    _synced[0] = True
    return True


def time_synced():
    return _synced[0]


def flash_dir():
    return "/"


def reset():
    machine.reset()
