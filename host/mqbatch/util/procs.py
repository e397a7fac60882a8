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


class SignalCalls:
    """`fn()` in a thread of its own each time `handler` (a signal handler) runs: the handler
    only writes one byte to a pipe, which the thread reads.

    A Python signal handler runs in the main thread between two bytecodes, also while that
    thread holds a lock, e.g. inside `Event.wait()` (the Event's plain Lock: `event.set()` in
    the handler then waits for it forever; `mqbatch vboard start --foreground` hung so once in
    CI after Ctrl-C) or inside vboard's stop() (the board's lock, which its SIGUSR1 reset
    takes); and a print in it can meet the main thread's own print (a reentrant write
    raises). The handler here takes no lock and writes to no stream."""

    def __init__(self, fn, name: str = "signal-calls"):
        self._fn = fn
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def handler(self, signum, frame) -> None:
        self._write(b"x")

    def close(self) -> None:
        """Ends the thread: no call after the ones already asked for."""
        self._write(b"c")

    def _write(self, byte: bytes) -> None:
        try:
            os.write(self._w, byte)
        except OSError:
            pass  # 64 KB of calls already pending, or the thread is done (EPIPE)

    def _run(self) -> None:
        try:
            while os.read(self._r, 1) == b"x":
                self._fn()
        finally:
            os.close(self._r)  # (the write end stays open: a later write fails with EPIPE, never
            # lands in another file that reused the number)


class SignalStop:
    """A stop request that a signal handler may make: `handler` (install it with
    on_stop_signals) notes the signal; SignalCalls' thread then calls `say(name)` (if given)
    once, with the first signal's name, and sets `event`."""

    def __init__(self, event: threading.Event | None = None, say=None):
        self.event = event if event is not None else threading.Event()
        self.names: list[str] = []  # the signals received, in order (list.append: no lock)
        self._say = say
        self._calls = SignalCalls(self._stop, "stop-signal")
        self._thread = self._calls._thread

    def handler(self, signum, frame) -> None:
        self.names.append(signal.Signals(signum).name)
        self._calls.handler(signum, frame)

    def close(self) -> None:
        """Ends the watching thread without setting the event (if no stop came)."""
        self._calls.close()

    def _stop(self) -> None:
        if not self.event.is_set():
            if self._say is not None:
                self._say(self.names[0])
            self.event.set()


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
