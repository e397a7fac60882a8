# mqb_wifi: Wi-Fi station and NTP for the boards that have them (esp32, rp2040).
# Used by their mqb_board modules; deployed with them (boards/<board>/deploy.json).
import network
import time

wlan = network.WLAN(network.STA_IF)
_synced = [False]


def connect(cfg):
    """Start (or restart) the link to cfg["wifi"]; True once connected, False after
    cfg["wifi"]["timeout_ms"] (the application then backs off and tries again)."""
    w = cfg["wifi"]
    if wlan.isconnected():
        return True
    wlan.active(True)
    wlan.connect(w["ssid"], w["password"])
    deadline = time.ticks_add(time.ticks_ms(), w.get("timeout_ms", 10000))
    while not wlan.isconnected():
        if time.ticks_diff(deadline, time.ticks_ms()) <= 0:
            wlan.disconnect()
            return False
        time.sleep_ms(100)
    return True


def up():
    return wlan.isconnected()


def rssi():
    """Signal strength in dBm, -127 when not connected."""
    return wlan.status("rssi") if wlan.isconnected() else -127


def sync_time():
    """Set the RTC from NTP; True when the clock is synced (now or before)."""
    import ntptime
    try:
        ntptime.settime()
    except OSError as e:
        print("mqb_wifi: NTP sync failed:", e)
        return _synced[0]
    _synced[0] = True
    return True


def time_synced():
    return _synced[0]
