"""An error from a child process shows at most the last TAIL_LINES lines of its log and
names the log file (two demos in one run directory each printed ~400 lines of Mosquitto
log as their error, issue 26)."""

import socket

import pytest

from mqbatch.lab.broker import BrokerError, Mosquitto
from mqbatch.util.procs import TAIL_LINES, log_tail, tail_lines


def test_tail_lines_keeps_the_last_lines_and_says_where_the_rest_is(tmp_path):
    log = tmp_path / "mosquitto.log"
    log.write_text("".join(f"line {i}\n" for i in range(1, 401)))
    out = log_tail(log)
    lines = out.splitlines()
    assert len(lines) == TAIL_LINES + 1
    assert lines[0] == f"(last {TAIL_LINES} of 400 lines of {log})"
    assert lines[1:] == [f"line {i}" for i in range(381, 401)]
    short = tail_lines("a\nb\n", path=log)
    assert short.splitlines() == [f"(log of {log}, 2 lines)", "a", "b"]
    assert "cannot be read" in log_tail(tmp_path / "missing.log")


@pytest.mark.broker
def test_a_broker_that_cannot_start_shows_a_short_tail_and_the_log_path(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        broker = Mosquitto(tmp_path / "broker", port=port)
        # an earlier life of this broker left a long log behind
        broker.log_path.write_text("".join(f"old line {i}\n" for i in range(400)))
        with pytest.raises(BrokerError) as e:
            broker.start(timeout=10)
    msg = str(e.value)
    assert "Address already in use" in msg
    assert str(broker.log_path) in msg, msg
    assert len(msg.splitlines()) <= TAIL_LINES + 2, msg
    assert "old line" not in msg
