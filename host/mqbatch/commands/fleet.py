"""`mqbatch fleet init|add|remove|show|run`: set up a real Mosquitto broker for your own
devices (CA, server certificate, accounts, policy, per-device config.json).
docs/fleet.md walks from nothing to a device landing telemetry."""

from __future__ import annotations

import argparse
import getpass
import os
import pathlib
import sys

from mqbatch.fleet import provision as fleet
from mqbatch.fleet.deploy import BOARD_NAMES
from mqbatch.lab.devices import from_fleet
from mqbatch.util.paths import ROOT


def _init(args: argparse.Namespace) -> None:
    key_password = None
    if args.ca_key_password_env:
        key_password = os.environ.get(args.ca_key_password_env, "").encode() or None
    state = fleet.init(
        args.dir,
        args.broker_host,
        port=args.port,
        bind=args.bind,
        ca_cert=args.ca_cert,
        ca_key=args.ca_key,
        ca_key_password=key_password,
        save_every_change=args.save_every_change,
        autosave_interval=args.autosave_interval,
        mtls_port=args.mtls_port,
    )
    fd = fleet.FleetDir(args.dir)
    print(f"fleet: created {fd.root} for broker {', '.join(state['broker']['hosts'])} port {state['broker']['port']}")
    print(f"fleet: next: mqbatch fleet add {fd.root} DEVICE...; then mosquitto -c {fd.conf}")


def _add(args: argparse.Namespace) -> None:
    wifi_password = None
    if args.wifi_password_file:
        wifi_password = pathlib.Path(args.wifi_password_file).read_text(encoding="utf-8").strip()
    elif args.wifi_ssid is not None and args.board != "unix" and sys.stdin.isatty():
        wifi_password = getpass.getpass(f"Wi-Fi password for {args.wifi_ssid}: ")
    paths = fleet.add(
        args.dir,
        args.devices,
        board=args.board,
        rotate=args.rotate,
        wifi_ssid=args.wifi_ssid,
        wifi_password=wifi_password,
        client_cert=args.client_cert,
    )
    for dev, path in zip(args.devices, paths):
        secret = f"key {path.parent / 'client.key.der'}" if args.client_cert else "password in config.json"
        print(f"fleet: {dev}: {path} (its {secret} and its batch-hmac key: 0600)")
    fd = fleet.FleetDir(args.dir)
    print(f"fleet: restart mosquitto to load the new accounts (mosquitto -c {fd.conf})")
    print(f"fleet: batch-hmac keys for the Spark job: mqbatch spark --hmac-keys {fd.hmac_keys} ...")


def _remove(args: argparse.Namespace) -> None:
    fleet.remove(args.dir, args.devices)
    print(
        f"fleet: removed {', '.join(args.devices)} (and their batch-hmac keys); "
        f"restart mosquitto to drop their accounts"
    )


def _show(args: argparse.Namespace) -> None:
    print("\n".join(fleet.show(args.dir)))


def _run(args: argparse.Namespace) -> int:
    run_dir = pathlib.Path(args.run_dir or ROOT / "run" / "fleet-devices")
    with from_fleet(args.dir, args.devices, run_dir, run_for_s=args.duration, sample_hz=args.sample_hz) as devices:
        devices.start()
        codes = devices.wait(args.duration + 120)
        sums = devices.summaries()
    for dev in args.devices:
        s = sums.get(dev, {})
        print(
            f"fleet: {dev}: exit {codes[dev]}, acked {s.get('acked_records')}/{s.get('stored_records')} records, "
            f"outbox {s.get('outbox_depth')} (console: {devices.dir(dev) / 'console.log'})"
        )
    return 0 if all(codes[d] == 0 and sums.get(d, {}).get("outbox_depth") == 0 for d in args.devices) else 1


def run(args: argparse.Namespace) -> int:
    try:
        return args.action(args) or 0
    except (fleet.FleetError, OSError) as e:
        print(f"mqbatch fleet: {e}", file=sys.stderr)
        return 1


def register(sub) -> None:
    p = sub.add_parser(
        "fleet", help="set up a broker for your devices: CA, certificates, accounts, configs", description=__doc__
    )
    acts = p.add_subparsers(dest="fleet_command", required=True, metavar="ACTION")
    i = acts.add_parser("init", help="create a fleet directory: CA, broker certificate and config, recorder account")
    i.add_argument("dir")
    i.add_argument(
        "--broker-host",
        required=True,
        action="append",
        help="name or IP address devices use to reach the broker (repeat for more names in the certificate; "
        "the first goes into the device configs)",
    )
    i.add_argument("--port", type=int, default=fleet.DEFAULT_PORT, help="TLS listener port (default 8883)")
    i.add_argument(
        "--mtls-port",
        type=int,
        help="also a listener where devices log in by client certificate (CN = device id; fleet's own CA only)",
    )
    i.add_argument("--bind", help="address the listener binds to (default: all addresses)")
    i.add_argument("--ca-cert", help="your CA's certificate (PEM); default: a new CA in DIR/pki")
    i.add_argument("--ca-key", help="your CA's private key (PEM; used once, not copied)")
    i.add_argument("--ca-key-password-env", metavar="VAR", help="environment variable holding the CA key's password")
    i.add_argument(
        "--save-every-change",
        action="store_true",
        help="persist after every change (a broker crash loses nothing acknowledged; costs I/O)",
    )
    i.add_argument(
        "--autosave-interval",
        type=int,
        default=fleet.AUTOSAVE_INTERVAL,
        help=f"seconds between persistence saves (default {fleet.AUTOSAVE_INTERVAL})",
    )
    i.set_defaults(action=_init)
    a = acts.add_parser("add", help="add devices: account, random password, config.json from the board template")
    a.add_argument("dir")
    a.add_argument("devices", nargs="+", metavar="DEVICE")
    a.add_argument("--board", choices=BOARD_NAMES, default="unix")
    a.add_argument("--rotate", action="store_true", help="give existing devices a new password (and batch-hmac key)")
    a.add_argument(
        "--client-cert",
        action="store_true",
        help="a client certificate instead of a password (the --mtls-port listener)",
    )
    a.add_argument("--wifi-ssid")
    a.add_argument("--wifi-password-file", help="file holding the Wi-Fi password (else asked on a terminal)")
    a.set_defaults(action=_add)
    rm = acts.add_parser("remove", help="delete devices: account, certificate (revoked), config directory")
    rm.add_argument("dir")
    rm.add_argument("devices", nargs="+", metavar="DEVICE")
    rm.set_defaults(action=_remove)
    s = acts.add_parser("show", help="list the broker files and devices (no secrets)")
    s.add_argument("dir")
    s.set_defaults(action=_show)
    r = acts.add_parser("run", help="run `unix` devices of the fleet as virtual devices (firmware in the Unix port)")
    r.add_argument("dir")
    r.add_argument("devices", nargs="+", metavar="DEVICE")
    r.add_argument("--duration", type=float, default=30, help="seconds of sampling")
    r.add_argument("--sample-hz", type=float, default=10)
    r.add_argument("--run-dir", help="flash directories (default run/fleet-devices)")
    r.set_defaults(action=_run)
    p.set_defaults(func=run)
