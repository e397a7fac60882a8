# mqb_config: the device configuration. config.json over the defaults, checked
# (the host runs the same checks before a deploy: mqbatch.deploy.check_config);
# the e2e_ack part is mqb_e2e's. Only start-up uses it: App keeps the config
# values it uses, not the config dict, and unloads this module once it is made
# (mqb_app.App: its heap back; import it again to check another config).
import json

# RAM: every public global of a module costs heap on a board even when its code
# runs from flash (a dict entry, its name): the defaults are built only when a
# config is made.
def defaults():
    """The configuration defaults (a fresh dict; the device's config.json overrides them)."""
    return {
        "topic": "mqbatch/{device_id}/telemetry",
        "status_topic": "mqbatch/{device_id}/status",
        "qos": 1,
        # lowest QoS the app publishes at when the broker's Maximum QoS is below "qos":
        # 0 sends at QoS 0 (no acknowledgement: a batch stays in the outbox until the broker
        # answers a PINGREQ sent after it); 1 keeps every batch in the outbox instead
        "min_qos": 0,
        "sample_hz": 10,
        "record_format": "binary",
        # flush.max_bytes: RAM for two batch buffers of max_bytes + header room (main.py: + 160 bytes)
        "flush": {"max_count": 100, "max_bytes": 4096, "max_age_ms": 5000},
        # outbox RAM index: segments x max_entries x 7 bytes (docs/outbox.md)
        "outbox": {"segment_bytes": 16384, "segments": 8, "max_entries": 32, "policy": "drop_oldest"},
        "health_every_s": 10,
        "backoff": {"initial_ms": 500, "max_ms": 30000},
        "run_for_s": None,          # None: run forever
        "drain_timeout_s": 60,      # after run_for_s: how long to keep sending the outbox
        # PUBACK 0x10 "No matching subscribers" is a success code in MQTT, but it means the
        # broker delivered the batch to nobody (e.g. the recorder's shared subscription is
        # not back yet after a broker restart): keep the batch and send it again later.
        "require_subscribers": True,
        # HMAC-SHA256 key (hex, 16..64 bytes) signing every batch as User Property
        # batch-hmac (docs/format.md); null: batches go unsigned
        "hmac_key": None,
        "broker": {"port": None, "tls": True, "ca": None, "server_hostname": None, "client_cert": None,
                   "client_key": None, "username": None, "password": None, "keepalive_s": 30,
                   "session_expiry_s": 3600, "receive_max": 4, "connect_timeout_ms": 3000},
    }


class ConfigError(ValueError):
    pass


def _merge(dst, src):
    for k in src:
        v = src[k]
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = v
    return dst


def load_config(path="config.json"):
    """The device config (boards/<board>/config.template.json) over the defaults, as the
    board boots (mqb_app.main). A config the firmware refuses is one log line and the
    application does not run: a reboot would refuse it again, every 5 s (main.py's
    fatal-error path). The Unix port exits with status 3 (a virtual board: to its REPL);
    a board idles until mpremote (Ctrl-C: its REPL, for `mqbatch deploy`) or a reset."""
    try:
        try:
            with open(path) as f:
                user = json.load(f)
        except OSError as e:
            raise ConfigError("cannot open %s: %s" % (path, e))
        except ValueError as e:
            raise ConfigError("%s is not valid JSON: %s" % (path, e))
        return make_config(user)
    except ConfigError as e:
        print("mqb: %s refused, not running: %s" % (path, e.args[0]))
    import sys
    if sys.platform == "linux":
        sys.exit(3)
    import time
    while True:
        time.sleep(60)


# The schema beyond defaults(): " path|type" for the keys with no default (or a None
# one) and, after ",<board name> ", each board's own (boards/<board>/mqb_board.py,
# boards/common/mqb_wifi.py). Types: s a string, n a number, b a boolean, O an object
# of the keys listed, c checked by its own code (hmac_key(), mqb_e2e), R a string the
# board needs, neither empty nor a template's placeholder. null passes the type check
# (make_config's rules say what is required). Constant strings, not tables of names:
# no name is interned for them and nothing stays on the heap once this module is
# unloaded (a new interned name can cost a whole new pool of them, docs/application.md).
_KEYS = const(" device_id|s hmac_key|c run_for_s|n e2e_ack|c broker.host|s broker.port|n broker.ca|s"
              " broker.server_hostname|s broker.client_cert|s broker.client_key|s broker.username|s"
              " broker.password|s")
_BOARDS = const(",unix sim_seed|n"
                ",esp32 wifi|O wifi.ssid|R wifi.password|R wifi.timeout_ms|n hw|O hw.vbat_adc_pin|n"
                " hw.vbat_divider_x1000|n"
                ",rp2040 wifi|O wifi.ssid|R wifi.password|R wifi.timeout_ms|n hw|O hw.vsys_adc_pin|n"
                " hw.vsys_divider_x1000|n,")
# the boards' templates hold these Wi-Fi credentials: a board given them never joins
_PLACEHOLDERS = const(" your-ssid your-wifi-password ")


def _check_types(user, ref, path, keys):
    # Every key must be a known one (defaults() or the table `keys`), and every value
    # given must have the type of its default (a number where the default is one);
    # the host runs this before a deploy (mqbatch.fleet.deploy.check_config).
    for k in user:
        v = user[k]
        key = path + k
        i = keys.find(" " + key + "|")
        if k in ref:
            d = ref[k]
        elif i < 0:
            raise ConfigError("unknown key %r" % key, key)     # make_config adds the closest key
        else:
            d = None
        if d is None:
            if v is None or i < 0:
                continue
            d = keys[i + len(key) + 2]
            if d == "c":
                continue
            d = 0 if d == "n" else {} if d == "O" else False if d == "b" else ""
        if isinstance(d, dict):
            if not isinstance(v, dict):
                raise ConfigError("%s must be an object, got %r" % (key, v))
            _check_types(v, d, key + ".", keys)
        elif isinstance(d, (bool, str)):
            if type(v) is not type(d):
                raise ConfigError("%s must be a %s, got %r" % (key, "boolean" if d is True or d is False
                                                               else "string", v))
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError("%s must be a number, got %r" % (key, v))


def make_config(user, board=None):
    """The config: `user` (config.json's object) checked and over the defaults, for
    `board` (mqb_board.NAME; None: this board's). ConfigError names what is wrong."""
    if not isinstance(user, dict):
        raise ConfigError("the config must be a JSON object")
    if board is None:
        import mqb_board
        board = mqb_board.NAME
    # the config first, at the start of the free space, then the checks' garbage after it
    cfg = _merge(defaults(), user)
    i = _BOARDS.find("," + board + " ")
    # this board's part of the table; a board module of another name: every board's keys
    keys = _KEYS + (_BOARDS[i + len(board) + 1:_BOARDS.find(",", i + 1)] if i >= 0 else _BOARDS)
    try:
        _check_types(user, defaults(), "", keys)
    except ConfigError as e:
        if len(e.args) < 2:
            raise
        # Only on this error path (here: a function more would be one more interned name,
        # which can cost a new pool of them): the valid key path nearest to the unknown
        # one, by edits to its last part (insert, delete, replace, swap two neighbours;
        # + 1 in another section), or another board's key said as such.
        key = e.args[1]
        if (_KEYS + _BOARDS).find(" " + key + "|") >= 0:
            raise ConfigError(e.args[0] + " (a setting of another board: is this config for this board?)")
        names = [p[:p.find("|")] for p in keys.split() if "|" in p]
        ref = defaults()
        for k in ref:
            names.append(k)
            if isinstance(ref[k], dict):
                names.extend([k + "." + j for j in ref[k]])
        i = key.rfind(".") + 1
        a = key[i:]
        best, most = "", 1 + len(a) // 4
        for p in names:
            j = p.rfind(".") + 1
            b = p[j:]
            prev, row = None, list(range(len(b) + 1))
            for x in range(1, len(a) + 1):
                new = [x] + [0] * len(b)
                for y in range(1, len(b) + 1):
                    new[y] = min(row[y] + 1, new[y - 1] + 1, row[y - 1] + (a[x - 1] != b[y - 1]))
                    if x > 1 and y > 1 and a[x - 1] == b[y - 2] and a[x - 2] == b[y - 1]:
                        new[y] = min(new[y], prev[y - 2] + 1)
                prev, row = row, new
            n = row[len(b)] + (key[:i] != p[:j])
            if n <= most:
                best, most = p, n - 1
        raise ConfigError(e.args[0] + (" (did you mean %r?)" % best if best else ""))
    for key in ("device_id",):
        if not cfg.get(key) or not isinstance(cfg[key], str):
            raise ConfigError("config lacks %r (a string)" % key)
    b = cfg["broker"]
    if not b.get("host") or not isinstance(b["host"], str):
        raise ConfigError("config lacks broker.host (a string: the broker's host name or address)")
    if b["tls"] and not b["ca"]:
        raise ConfigError("broker.tls is on but broker.ca (the CA certificate file) is not set; "
                          "plain TCP must be chosen explicitly with broker.tls = false")
    if cfg["qos"] not in (0, 1, 2):
        raise ConfigError("qos must be 0, 1 or 2, got %r" % cfg["qos"])
    if cfg["min_qos"] not in (0, 1, 2) or cfg["min_qos"] > cfg["qos"]:
        raise ConfigError("min_qos must be 0, 1 or 2 and at most qos (%r), got %r" % (cfg["qos"], cfg["min_qos"]))
    if not 0 < cfg["sample_hz"] <= 1000:
        raise ConfigError("sample_hz must be in (0, 1000], got %r" % cfg["sample_hz"])
    v = cfg["flush"]["max_bytes"]
    if type(v) is not int or not 64 <= v <= 1048576:
        # main.py sizes the two batch buffers from it (+ 160) before this check runs
        raise ConfigError("flush.max_bytes must be a whole number of bytes in 64..1048576, got %r" % v)
    hmac_key(cfg)
    for p in keys.split():
        if p[-1] == "R":
            # a setting the board needs: Wi-Fi's, never empty nor the template's placeholder
            p = p[:-2]
            j = p.find(".")
            v = (cfg.get(p[:j]) or {}).get(p[j + 1:])
            if not v and i >= 0:
                raise ConfigError("config lacks %s (a string: this board joins Wi-Fi)" % p)
            if v and " " + v + " " in _PLACEHOLDERS:
                raise ConfigError("%s is the template's placeholder %r: the board would never join Wi-Fi "
                                  "(mqbatch fleet add --wifi-ssid NAME --wifi-password-file FILE)" % (p, v))
    if cfg.get("e2e_ack") is not None:
        # end-to-end acks (docs/e2e-ack.md): "e2e_ack": {"enabled": bool, "resend_after_s": 30}.
        # Its defaults and checks live in mqb_e2e: in this module they would cost heap on
        # every device (a default's dict entry, each message). When disabled, mqb_e2e
        # removes the key (and unloads itself): cfg["e2e_ack"] present means enabled
        import mqb_e2e
        mqb_e2e.make_config(cfg, ConfigError)
    import gc
    gc.collect()
    return cfg


def hmac_key(cfg):
    """The batch-hmac key from cfg["hmac_key"] (hex text) as bytes, or None."""
    text = cfg.get("hmac_key")
    if text is None:
        return None
    from binascii import unhexlify    # here, not a module global: each global costs heap
    try:
        key = unhexlify(text)
    except (TypeError, ValueError):
        raise ConfigError("hmac_key must be hex text (2 digits per byte)")
    if not 16 <= len(key) <= 64:
        raise ConfigError("hmac_key of %d bytes: must be 16..64 bytes" % len(key))
    return key
