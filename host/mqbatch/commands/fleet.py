"""`mqbatch fleet init|add|remove|units|show|run`: set up a real Mosquitto broker for your own
devices (CA, server certificate, accounts, policy, per-device config.json).
docs/fleet.md walks from nothing to a device landing telemetry."""

from __future__ import annotations

import argparse
import getpass
import os
import pathlib
import signal
import sys

from mqbatch.commands.report import HtmlReport
from mqbatch.fleet import provision as fleet
from mqbatch.fleet.deploy import BOARD_NAMES
from mqbatch.lab.devices import from_fleet, progress_lines
from mqbatch.util.argtypes import directory, existing_file
from mqbatch.util.paths import ROOT
from mqbatch.util.procs import stop_signals_interrupt
from mqbatch.util.rundir import DirInUse, lock_dir

WIFI_BOARDS = ("esp32", "rp2040")  # their templates hold Wi-Fi placeholders that would never connect


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
    print(f"fleet: per-source connection limits for the broker's port: nft -f {fd.firewall} (as root)")


def _add(args: argparse.Namespace) -> int | None:
    wifi_password = None
    if args.board in WIFI_BOARDS and not args.rotate and not args.wifi_ssid:  # a rotation keeps its Wi-Fi
        print(f"mqbatch fleet add: --board {args.board} joins Wi-Fi: give --wifi-ssid NAME", file=sys.stderr)
        return 2
    if args.wifi_password_file:
        wifi_password = pathlib.Path(args.wifi_password_file).read_text(encoding="utf-8").strip()
    elif args.wifi_ssid is not None and args.board != "unix" and sys.stdin.isatty():
        wifi_password = getpass.getpass(f"Wi-Fi password for {args.wifi_ssid}: ")
    if args.board in WIFI_BOARDS and not args.rotate and not wifi_password:
        print(
            f"mqbatch fleet add: --board {args.board} joins Wi-Fi: give --wifi-password-file FILE "
            "(or run on a terminal to be asked); an empty password is refused",
            file=sys.stderr,
        )
        return 2
    before = set(fleet.FleetDir(args.dir).load()["devices"])
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
    added = [d for d in args.devices if d not in before]
    print(
        f"fleet: broker: {fleet.live_update(args.dir, added=added, rotated=[d for d in args.devices if d in before])}"
    )
    print(f"fleet: batch-hmac keys for the Spark job: mqbatch spark --hmac-keys {fd.hmac_keys} ...")


def _remove(args: argparse.Namespace) -> None:
    fleet.remove(args.dir, args.devices)
    print(f"fleet: removed {', '.join(args.devices)} (and their batch-hmac keys)")
    print(f"fleet: broker: {fleet.live_update(args.dir, removed=args.devices)}")


def _units(args: argparse.Namespace) -> None:
    paths = fleet.write_units(
        args.dir, landing=args.landing, spark_out=args.spark_out, user=args.user, mqbatch=args.mqbatch
    )
    print(f"fleet: wrote {len(paths)} systemd units in {paths[0].parent}:")
    for path in paths:
        print(f"fleet:   {path.name}")
    names = " ".join(p.stem for p in paths)
    print(
        f"fleet: install: sudo cp {paths[0].parent}/*.service /etc/systemd/system/ && sudo systemctl daemon-reload "
        f"&& sudo systemctl enable --now {names}"
    )


def _show(args: argparse.Namespace) -> None:
    print("\n".join(fleet.show(args.dir)))


def _run(args: argparse.Namespace) -> int:
    run_dir = pathlib.Path(args.run_dir or ROOT / "run" / "fleet-devices")
    os.umask(0o077)  # flash directories, firmware copies, outboxes: private at rest (docs/security.md)
    stop = stop_signals_interrupt("fleet run")
    try:  # Ctrl-C, SIGTERM, SIGHUP: the devices are stopped, one line, no traceback
        with (
            stop,
            lock_dir(run_dir, "mqbatch fleet run"),  # two runs never share the devices' flash
            from_fleet(args.dir, args.devices, run_dir, run_for_s=args.duration, sample_hz=args.sample_hz) as devices,
        ):
            devices.start()
            codes = devices.wait(args.duration + 120, progress_lines("fleet run", run_for_s=args.duration))
            sums = devices.summaries()
    except KeyboardInterrupt:
        sig = stop.received or signal.SIGINT
        print(f"fleet run: interrupted ({signal.Signals(sig).name}); its devices have been stopped", file=sys.stderr)
        return 128 + sig
    for dev in args.devices:
        s = sums.get(dev, {})
        print(
            f"fleet: {dev}: exit {codes[dev]}, acked {s.get('acked_records')}/{s.get('stored_records')} records, "
            f"outbox {s.get('outbox_depth')} (console: {devices.dir(dev) / 'console.log'})"
        )
    if args.spark_out:  # the HTML report of the Spark output these devices feed, as the demo writes it
        HtmlReport(args.spark_out, "fleet run").write()
    return 0 if all(codes[d] == 0 and sums.get(d, {}).get("outbox_depth") == 0 for d in args.devices) else 1


def run(args: argparse.Namespace) -> int:
    try:
        return args.action(args) or 0
    except (fleet.FleetError, DirInUse, OSError) as e:
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
    a.add_argument(
        "--wifi-password-file", type=existing_file, help="file holding the Wi-Fi password (else asked on a terminal)"
    )
    a.set_defaults(action=_add)
    rm = acts.add_parser("remove", help="delete devices: account, certificate (revoked), config directory")
    rm.add_argument("dir")
    rm.add_argument("devices", nargs="+", metavar="DEVICE")
    rm.set_defaults(action=_remove)
    u = acts.add_parser(
        "units", help="write systemd units: broker (+ its firewall rules), recorder, streaming Spark job"
    )
    u.add_argument("dir")
    u.add_argument("--landing", required=True, help="landing zone of the recorder (read by the Spark job)")
    u.add_argument("--spark-out", required=True, help="output directory of the streaming Spark job")
    u.add_argument("--user", help="account the services run as (default: the owner of DIR; make a dedicated one)")
    u.add_argument("--mqbatch", help="absolute path of the mqbatch command (default: the one running now)")
    u.set_defaults(action=_units)
    s = acts.add_parser("show", help="list the broker files and devices (no secrets)")
    s.add_argument("dir")
    s.set_defaults(action=_show)
    r = acts.add_parser("run", help="run `unix` devices of the fleet as virtual devices (firmware in the Unix port)")
    r.add_argument("dir")
    r.add_argument("devices", nargs="+", metavar="DEVICE")
    r.add_argument("--duration", type=float, default=30, help="seconds of sampling")
    r.add_argument("--sample-hz", type=float, default=10)
    r.add_argument("--run-dir", help="flash directories (default run/fleet-devices)")
    r.add_argument(
        "--spark-out",
        type=directory,
        metavar="DIR",
        help="the Spark job's --out these devices feed: write DIR/report.html (as `mqbatch report`) after the run",
    )
    r.set_defaults(action=_run)
    p.set_defaults(func=run)
