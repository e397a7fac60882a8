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
    """Read the device config (boards/<board>/config.template.json) over the defaults."""
    try:
        with open(path) as f:
            user = json.load(f)
    except OSError as e:
        raise ConfigError("cannot open %s: %s" % (path, e))
    except ValueError as e:
        raise ConfigError("%s is not valid JSON: %s" % (path, e))
    return make_config(user)


def _check_types(user, ref, path):
    # Every value given must have the type of its default (a number where the default
    # is one); the host runs this before a deploy (mqbatch.deploy.check_config).
    for k in user:
        v = user[k]
        d = ref.get(k)
        if d is None:
            # no default to compare with: the broker's optional names and port
            d = "" if k in ("ca", "server_hostname", "client_cert", "client_key", "username",
                            "password") else 0 if k in ("port", "run_for_s") else None
            if d is None or v is None:
                continue
        if isinstance(d, dict):
            if not isinstance(v, dict):
                raise ConfigError("%s%s must be an object, got %r" % (path, k, v))
            _check_types(v, d, path + k + ".")
        elif isinstance(d, (bool, str)):
            if type(v) is not type(d):
                raise ConfigError("%s%s must be a %s, got %r" % (path, k, "boolean" if d is True or d is False
                                                                 else "string", v))
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError("%s%s must be a number, got %r" % (path, k, v))


def make_config(user):
    if not isinstance(user, dict):
        raise ConfigError("the config must be a JSON object")
    _check_types(user, defaults(), "")
    cfg = _merge(defaults(), user)
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
    hmac_key(cfg)
    if cfg.get("e2e_ack") is not None:
        # end-to-end acks (docs/e2e-ack.md): "e2e_ack": {"enabled": bool, "resend_after_s": 30}.
        # Its defaults and checks live in mqb_e2e: in this module they would cost heap on
        # every device (a default's dict entry, each message). When disabled, mqb_e2e
        # removes the key (and unloads itself): cfg["e2e_ack"] present means enabled
        import mqb_e2e
        mqb_e2e.make_config(cfg, ConfigError)
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
