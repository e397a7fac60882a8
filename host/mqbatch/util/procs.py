"""Ending child processes: one way for every part of mqbatch that starts them."""

from __future__ import annotations

import os
import signal
import subprocess
import threading


def end_process(p: subprocess.Popen, timeout: float = 10.0, group: bool = False) -> int | None:
    """SIGTERM p (its whole process group if `group`, for children started with
    start_new_session=True), SIGKILL after `timeout` s. Returns p's exit code."""

    def send(sig):
        try:
            if group:
                os.killpg(p.pid, sig)
            elif p.poll() is None:
                p.send_signal(sig)
        except ProcessLookupError:
            return False  # already gone
        return True

    if p.poll() is not None and not group:
        return p.returncode
    send(signal.SIGTERM)
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        p.wait(5)
    if group:
        send(signal.SIGKILL)  # the leader is gone; anything it left in its group goes too
    return p.returncode


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def on_stop_signals(handler) -> dict:
    """Call handler(signum, frame) on SIGINT, SIGTERM and SIGHUP (Ctrl-C, `kill`, a closed
    terminal). Returns the previous handlers for restore_signals(). Main thread only."""
    return {s: signal.signal(s, handler) for s in STOP_SIGNALS}


def restore_signals(previous: dict) -> None:
    for s, h in previous.items():
        signal.signal(s, h)


class SignalStop:
    """A stop request that a signal handler may make: `handler` (install it with
    on_stop_signals) notes the signal and writes one byte to a pipe; a thread of this object's
    own then calls `say(name)` (if given) and sets `event`.

    A Python signal handler runs in the main thread between two bytecodes, also inside
    `Event.wait()` while that holds the Event's lock (a plain Lock): `event.set()` in the
    handler then waits for that lock forever (`mqbatch vboard start --foreground` hung so
    once in CI after Ctrl-C), and a print in it can meet the main thread's own print (a
    reentrant write raises). The handler here takes no lock and writes to no stream."""

    def __init__(self, event: threading.Event | None = None, say=None):
        self.event = event if event is not None else threading.Event()
        self.names: list[str] = []  # the signals received, in order (list.append: no lock)
        self._say = say
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self._thread = threading.Thread(target=self._watch, name="stop-signal", daemon=True)
        self._thread.start()

    def handler(self, signum, frame) -> None:
        self.names.append(signal.Signals(signum).name)
        self.request()

    def request(self) -> None:
        """Ask for the stop without a lock (what handler does after noting the signal)."""
        try:
            os.write(self._w, b"s")
        except OSError:
            pass  # the pipe is full, or its reader is done (EPIPE): a stop is already on its way

    def close(self) -> None:
        """Ends the watching thread without setting the event (if no stop came)."""
        try:
            os.write(self._w, b"c")
        except OSError:
            pass

    def _watch(self) -> None:
        try:
            got = os.read(self._r, 1)
        finally:
            os.close(self._r)  # (the write end stays open: a later write fails with EPIPE, never
            # lands in another file that reused the number)
        if got == b"s":
            if self._say is not None:
                self._say(self.names[0] if self.names else "stop")
            self.event.set()


class SignalCalls:
    """`fn()` in a thread of its own each time `handler` (a signal handler) runs: for a
    handler whose work takes a lock (vboard's SIGUSR1 reset takes the board's lock, which
    the main thread holds while it stops the board: SignalStop's reasons)."""

    def __init__(self, fn, name: str = "signal-calls"):
        self._fn = fn
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def handler(self, signum, frame) -> None:
        try:
            os.write(self._w, b"x")
        except OSError:
            pass  # 64 KB of calls already pending

    def _run(self) -> None:
        while os.read(self._r, 1):
            self._fn()


class stop_signals_interrupt:
    """`with stop_signals_interrupt():` SIGTERM and SIGHUP end the block like Ctrl-C:
    KeyboardInterrupt is raised in the main thread, so `finally:` clean-up runs and
    nothing the command started is left behind. A second signal while that clean-up
    runs is reported and ignored (the clean-up finishes). Used by `mqbatch demo`,
    `devices`; any command that starts processes can use it."""

    def __init__(self, name: str = "mqbatch", err=None):
        self.name, self.err = name, err
        self.received: int | None = None  # the first stop signal, if any

    def _handler(self, signum, frame):
        if self.received is None:
            self.received = signum
            raise KeyboardInterrupt(signal.Signals(signum).name)
        line = f"{self.name}: {signal.Signals(signum).name} again: still stopping what was started\n"
        if self.err is not None:
            self.err.write(line)
        else:  # straight to fd 2: a print here could meet the main thread's own print (SignalStop)
            try:
                os.write(2, line.encode())
            except OSError:
                pass

    def __enter__(self):
        self._previous = on_stop_signals(self._handler)
        return self

    def __exit__(self, *exc):
        restore_signals(self._previous)
        return False


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int | None = None, sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies, whatever killed the
    parent (SIGKILL included, which no handler sees); the setting survives exec. Use as a
    Popen preexec_fn (functools.partial(die_with_parent, os.getpid())) or in a child itself.
    If the parent is already gone (getppid() != parent), exits at once. Linux only: False
    where prctl is not available."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if parent is not None and os.getppid() != parent:  # died before prctl: nobody would send it
        os._exit(1)
    return True


TAIL_LINES = 20  # what an error shows of a child's log; the rest stays in the file it names


def tail_lines(text: str, lines: int = TAIL_LINES, path: object = None) -> str:
    """The last `lines` lines of a child's output, for an error message: a first line
    saying how many were left out and where the whole log is (`path`), then the tail.
    Never hundreds of lines of someone else's log as our error."""
    all_lines = text.rstrip("\n").splitlines()
    where = f" of {path}" if path is not None else ""
    if len(all_lines) <= lines:
        head = f"(log{where}, {len(all_lines)} lines)" if path is not None else ""
    else:
        head = f"(last {lines} of {len(all_lines)} lines{where or ' of the log'})"
    return "\n".join(([head] if head else []) + all_lines[-lines:])


def log_tail(path, lines: int = TAIL_LINES) -> str:
    """tail_lines() of the file at `path` ('' if it cannot be read)."""
    import pathlib

    try:
        text = pathlib.Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        return f"(log {path} cannot be read: {e.strerror or e})"
    return tail_lines(text, lines, path)
