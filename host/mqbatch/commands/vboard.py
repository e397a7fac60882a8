"""`mqbatch vboard start|stop|reset|console --dir DIR`: a virtual board (the MicroPython
Unix port on a pseudo-terminal with its own littlefs flash image, mqbatch.lab.vboard)
to deploy to like a real one:

    mqbatch vboard start --dir board            # prints the port: board/tty
    mqbatch deploy --port board/tty --board unix --config dev.json
    mpremote connect board/tty ls               # as with a board: cp, mip install, reset...
    mqbatch vboard reset --dir board            # a hard reset: main.py runs again
    mqbatch vboard console --dir board --follow # the device's log (board/console.log)
    mqbatch vboard stop --dir board

`start` runs the board in the background (its pid in DIR/vboard.pid) and returns
once the port is up; `--foreground` keeps it in this process until Ctrl-C,
SIGTERM or SIGHUP. Either way stopping ends the interpreter too."""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import subprocess
import sys
import time

from mqbatch.lab.vboard import DEFAULT_FLASH, DEFAULT_HEAP, PID_FILE, parse_size, serve


def _running_pid(flash: pathlib.Path) -> int | None:
    """The pid of the supervisor serving `flash`, or None (no pid file, or a stale one)."""
    try:
        pid = int((flash / PID_FILE).read_text().strip())
    except FileNotFoundError:
        return None
    except ValueError:
        return None  # a torn or foreign file: treated as no board; start rewrites it
    try:
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None  # that process is gone
    return pid if b"mqbatch.lab.vboard" in cmdline or b"vboard" in cmdline else None


def start(args: argparse.Namespace) -> int:
    flash = pathlib.Path(args.dir).resolve()
    heap = None if args.heapsize.lower() == "none" else args.heapsize
    pid = _running_pid(flash)
    if pid:
        print(
            f"vboard: a board already runs in {flash} (pid {pid}); `mqbatch vboard stop --dir {args.dir}`",
            file=sys.stderr,
        )
        return 1
    try:
        parse_size(args.flash_size)
    except ValueError as e:
        print(f"vboard: {e}", file=sys.stderr)
        return 1
    if args.foreground:
        try:
            return serve(flash, heap, flash_size=args.flash_size)
        except (OSError, ValueError, TimeoutError) as e:
            print(f"vboard: {e}", file=sys.stderr)
            return 1
    flash.mkdir(parents=True, exist_ok=True)
    (flash / "tty").unlink(missing_ok=True)  # a link left by a killed board is not a live port
    log = open(flash / "vboard.log", "ab")
    with log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mqbatch.lab.vboard",
                str(flash),
                "--heapsize",
                heap or "none",
                "--flash-size",
                args.flash_size,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    deadline = time.monotonic() + args.timeout
    while not (flash / "tty").exists():
        if proc.poll() is not None:
            tail = (flash / "vboard.log").read_text(errors="replace")[-1500:]
            print(f"vboard: the board did not start (exit {proc.returncode}):\n{tail}", file=sys.stderr)
            return 1
        if time.monotonic() > deadline:
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)
            print(f"vboard: no port within {args.timeout:.0f} s; stopped (see {flash / 'vboard.log'})", file=sys.stderr)
            return 1
        time.sleep(0.05)
    print(
        f"vboard: up, port {flash / 'tty'} (heap {heap or 'port default'}, pid {proc.pid}); "
        f"device log: {flash / 'console.log'}"
    )
    return 0


def _signal_board(args: argparse.Namespace, sig: int) -> tuple[pathlib.Path, int | None]:
    """Send `sig` to the supervisor of --dir; (its flash dir, its pid or None: no board, said on stderr)."""
    flash = pathlib.Path(args.dir).resolve()
    pid = _running_pid(flash)
    if pid is None:
        print(f"vboard: no board runs in {flash}", file=sys.stderr)
    else:
        os.kill(pid, sig)
    return flash, pid


def stop(args: argparse.Namespace) -> int:
    flash, pid = _signal_board(args, signal.SIGTERM)
    if pid is None:
        return 1
    deadline = time.monotonic() + args.timeout
    while pathlib.Path(f"/proc/{pid}").exists() and _running_pid(flash) == pid:
        if time.monotonic() > deadline:
            print(f"vboard: pid {pid} did not stop within {args.timeout:.0f} s", file=sys.stderr)
            return 1
        time.sleep(0.1)
    print(f"vboard: stopped the board in {flash}")
    return 0


def reset(args: argparse.Namespace) -> int:
    flash, pid = _signal_board(args, signal.SIGUSR1)  # the supervisor ends the interpreter and boots it again
    if pid is None:
        return 1
    print(f"vboard: reset the board in {flash}")
    return 0


def console(args: argparse.Namespace) -> int:
    path = pathlib.Path(args.dir) / "console.log"
    if not path.exists():
        print(f"vboard: {path} does not exist (no board was started in {args.dir})", file=sys.stderr)
        return 1
    with open(path, "rb") as f:
        out = sys.stdout.buffer
        while True:
            chunk = f.read(65536)
            if chunk:
                out.write(chunk)
                out.flush()
            elif not args.follow:
                return 0
            else:
                try:
                    time.sleep(0.2)
                except KeyboardInterrupt:
                    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "vboard",
        help="a virtual board on a pseudo-terminal, to deploy to (start|stop|reset|console)",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    s = actions.add_parser("start", help="start a board; prints its port")
    s.add_argument("--dir", required=True, help="the board's flash directory (created if missing)")
    s.add_argument(
        "--heapsize",
        default=DEFAULT_HEAP,
        help=f"MicroPython heap (default {DEFAULT_HEAP}: what the deployed firmware runs in; 'none': the port's own)",
    )
    s.add_argument(
        "--flash-size", default=DEFAULT_FLASH, help=f"size of its flash image DIR/flash.img (default {DEFAULT_FLASH})"
    )
    s.add_argument("--foreground", action="store_true", help="run in this process until Ctrl-C/SIGTERM/SIGHUP")
    s.add_argument("--timeout", type=float, default=20, help="seconds to wait for the port")
    s.set_defaults(func=start)
    t = actions.add_parser("stop", help="stop the board of --dir (supervisor and interpreter)")
    t.add_argument("--dir", required=True)
    t.add_argument("--timeout", type=float, default=30)
    t.set_defaults(func=stop)
    r = actions.add_parser("reset", help="hard-reset the board of --dir (boot.py and main.py run again)")
    r.add_argument("--dir", required=True)
    r.set_defaults(func=reset)
    c = actions.add_parser("console", help="print the device's log (DIR/console.log)")
    c.add_argument("--dir", required=True)
    c.add_argument("--follow", "-f", action="store_true", help="keep printing what the device writes, until Ctrl-C")
    c.set_defaults(func=console)
