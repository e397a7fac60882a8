# MicroPython tests of firmware/mqb_config.py: the device config's schema (known keys,
# types, the boards' own keys, Wi-Fi placeholders), as the board checks it at boot and
# `mqbatch deploy` / `mqbatch fleet add` check it on the host (the same module, run in
# the Unix port). Run in the 64-bit Unix port (tests/conftest.py) and the 32-bit
# WebAssembly port (tests/mpy32/test_wasm32.py).
import mqb_config as C
from outbox_util import raises

BASE = {"device_id": "d", "broker": {"host": "127.0.0.1", "tls": False}}
WIFI = {"ssid": "home", "password": "secret-123", "timeout_ms": 10000}


def cfg(**kw):
    c = {"device_id": "d", "broker": dict(BASE["broker"])}
    for k in kw:
        c[k] = kw[k]
    return c


def refused(user, board="unix"):
    return str(raises(C.ConfigError, C.make_config, user, board))


def test_unknown_top_level_key_is_refused_with_the_closest():
    """A typo'd key used to be merged in silently and the default used instead."""
    assert refused(cfg(sampel_hz=5)) == "unknown key 'sampel_hz' (did you mean 'sample_hz'?)"
    assert refused(cfg(qso=1)) == "unknown key 'qso' (did you mean 'qos'?)"
    # a key of a section given at the top level: its full path is suggested
    assert refused(cfg(port=1883)) == "unknown key 'port' (did you mean 'broker.port'?)"
    assert refused(cfg(brokr={})) == "unknown key 'brokr' (did you mean 'broker'?)"
    # nothing close: no guess
    assert refused(cfg(colour="red")) == "unknown key 'colour'"


def test_unknown_nested_key_names_its_full_path():
    """broker.prot for broker.port: deploy reported success and the device retried
    port 8883 forever (issue 26.1)."""
    c = cfg()
    c["broker"]["prot"] = 1883
    assert refused(c) == "unknown key 'broker.prot' (did you mean 'broker.port'?)"
    assert refused(cfg(flush={"max_byte": 2048})) == "unknown key 'flush.max_byte' (did you mean 'flush.max_bytes'?)"
    assert refused(cfg(outbox={"segmets": 4})) == "unknown key 'outbox.segmets' (did you mean 'outbox.segments'?)"
    assert refused(cfg(backoff={"initial_ms": 1, "maxms": 9})) == \
        "unknown key 'backoff.maxms' (did you mean 'backoff.max_ms'?)"


def test_every_known_key_passes():
    """Every default, every key with no default, and the e2e_ack object (mqb_e2e checks inside it)."""
    c = C.defaults()
    c["device_id"] = "d"
    c["broker"].update(host="h", port=1883, tls=False, ca="ca.der", server_hostname="h", client_cert="c.der",
                       client_key="k.der", username="u", password="p")
    c.update(hmac_key="ab" * 32, run_for_s=5, e2e_ack={"enabled": False})
    got = C.make_config(c, "unix")
    assert got["broker"]["port"] == 1883 and got["run_for_s"] == 5
    assert C.make_config(cfg(sim_seed=7, run_for_s=None), "unix")["sim_seed"] == 7
    w = C.make_config(cfg(wifi=WIFI, hw={"vbat_adc_pin": 35, "vbat_divider_x1000": 2000}), "esp32")
    assert w["wifi"]["ssid"] == "home" and w["hw"]["vbat_adc_pin"] == 35
    assert C.make_config(cfg(wifi=WIFI, hw={"vsys_adc_pin": None, "vsys_divider_x1000": 3000}), "rp2040")


def test_wrong_type_is_still_caught():
    assert refused(cfg(sample_hz="ten")) == "sample_hz must be a number, got 'ten'"
    assert refused(cfg(flush={"max_bytes": "2k"})) == "flush.max_bytes must be a number, got '2k'"
    for bad in (4096.0, -500, 63, 1048577, 9999999999):   # main.py sizes two buffers with it: a whole number in range
        assert refused(cfg(flush={"max_bytes": bad})) == \
            "flush.max_bytes must be a whole number of bytes in 64..1048576, got %r" % bad, bad
    assert C.make_config(cfg(flush={"max_bytes": 64}))["flush"]["max_bytes"] == 64
    assert refused(cfg(require_subscribers="yes")) == "require_subscribers must be a boolean, got 'yes'"
    assert refused(cfg(flush=5)) == "flush must be an object, got 5"
    c = cfg()
    c["broker"]["port"] = "8883"
    assert refused(c) == "broker.port must be a number, got '8883'"
    # the keys without a default are typed by the schema too
    assert refused(cfg(device_id=7)) == "device_id must be a string, got 7"
    assert refused(cfg(wifi=dict(WIFI, timeout_ms="10s")), "esp32") == "wifi.timeout_ms must be a number, got '10s'"
    assert refused(cfg(wifi=[1]), "esp32") == "wifi must be an object, got [1]"


def test_each_board_has_its_own_keys():
    """The Wi-Fi and pin settings belong to the boards that read them (mqb_wifi, mqb_board)."""
    assert refused(cfg(wifi=WIFI), "unix") == "unknown key 'wifi' (a setting of another board: " \
        "is this config for this board?)"
    assert "another board" in refused(cfg(wifi=WIFI, hw={"vsys_adc_pin": 26}), "esp32")
    assert refused(cfg(wifi=WIFI, hw={"vbat_adc_pn": 35}), "esp32") == \
        "unknown key 'hw.vbat_adc_pn' (did you mean 'hw.vbat_adc_pin'?)"
    assert "another board" in refused(cfg(wifi=WIFI, sim_seed=1), "rp2040")
    # a board module of another name: every board's keys
    assert C.make_config(cfg(wifi=WIFI, sim_seed=1), "myboard")


def test_wifi_boards_refuse_missing_or_placeholder_credentials():
    """The boards' templates hold your-ssid / your-wifi-password: a board given them never
    joins Wi-Fi, and without wifi it failed on cfg["wifi"] at every connect (issue 26.2)."""
    for board in ("esp32", "rp2040"):
        assert refused(cfg(), board) == "config lacks wifi.ssid (a string: this board joins Wi-Fi)"
        assert refused(cfg(wifi={"ssid": "", "password": "x"}), board).startswith("config lacks wifi.ssid")
        assert refused(cfg(wifi={"ssid": "home"}), board).startswith("config lacks wifi.password")
        e = refused(cfg(wifi=dict(WIFI, ssid="your-ssid")), board)
        assert e.startswith("wifi.ssid is the template's placeholder 'your-ssid': the board would never join"), e
        e = refused(cfg(wifi=dict(WIFI, password="your-wifi-password")), board)
        assert e.startswith("wifi.password is the template's placeholder 'your-wifi-password'"), e
        # an empty password is refused too, as `mqbatch fleet add` refuses one
        assert refused(cfg(wifi=dict(WIFI, password="")), board).startswith("config lacks wifi.password")


def test_board_defaults_to_this_boards_module():
    """On the device make_config(cfg) uses mqb_board.NAME (here the unix board's)."""
    import mqb_board
    assert mqb_board.NAME == "unix"
    assert "another board" in str(raises(C.ConfigError, C.make_config, cfg(wifi=WIFI)))
    assert C.make_config(cfg(sim_seed=3))["sim_seed"] == 3


def test_load_config_refuses_at_boot_without_a_reboot():
    """At boot (mqb_app.main -> load_config) a refused config is one log line and the app
    does not run: the Unix port exits with status 3 (a board idles at its REPL's door);
    main.py's fatal-error path used to reboot on it every 5 s."""
    import json
    import os
    name = "mp_test_config_load.json"
    try:
        for text in ('{"device_id": "d", "broker": {"host": "h", "tls": false, "prot": 1}}', '{"device_id": ',
                     '{"device_id": "d", "broker": {"host": "h", "tls": false}, "sampel_hz": 5}'):
            with open(name, "w") as f:
                f.write(text)
            e = raises(SystemExit, C.load_config, name)
            assert e.args == (3,), e.args
        with open(name, "w") as f:
            f.write(json.dumps(cfg(sample_hz=5)))
        assert C.load_config(name)["sample_hz"] == 5
    finally:
        os.remove(name)
    assert raises(SystemExit, C.load_config, name).args == (3,)     # no config.json at all
