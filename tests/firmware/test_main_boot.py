"""main.py, the board's boot entry, with a config.json the firmware cannot use: missing,
not JSON, JSON that is not an object, a wrong type where main.py sizes its buffers. Each
must end as a refused config does (mqb_config.load_config: one named line, not running;
the Unix port exits 3, a board idles at its REPL's door), not in main.py's fatal-error
path, which rebooted every 5 s for ever (the early read of config.json for the buffer
sizes raised before the firmware's check ran). Run in the real Unix port."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from mqbatch.util.paths import FIRMWARE
from mqbatch_testing import MICROPYTHON, mpy_env

CASES = {
    "missing": None,
    "not JSON": '{"device_id": ',
    "a JSON list": "[1, 2]",
    "max_bytes a string": '{"device_id": "d", "broker": {"host": "h", "tls": false}, "flush": {"max_bytes": "4096"}}',
    "broker a string": '{"device_id": "d", "broker": "h"}',
    # numbers main.py cannot size a buffer with (a float: TypeError in bytearray) or should not
    "max_bytes a float": '{"device_id": "d", "broker": {"host": "h", "tls": false}, "flush": {"max_bytes": 4096.0}}',
    "max_bytes negative": '{"device_id": "d", "broker": {"host": "h", "tls": false}, "flush": {"max_bytes": -500}}',
    "max_bytes 10 GB": '{"device_id": "d", "broker": {"host": "h", "tls": false}, "flush": {"max_bytes": 9999999999}}',
}


@pytest.mark.parametrize("case", CASES)
def test_an_unusable_config_json_is_refused_in_one_line_without_a_reboot(case, tmp_path):
    shutil.copy(FIRMWARE / "main.py", tmp_path / "main.py")
    if CASES[case] is not None:
        (tmp_path / "config.json").write_text(CASES[case])
    proc = subprocess.run(
        [str(MICROPYTHON), "main.py"], env=mpy_env(), cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    out = proc.stdout + proc.stderr
    assert "restarting" not in out and "Traceback" not in out, out
    assert proc.returncode == 3, out
    refused = [line for line in out.splitlines() if "refused, not running" in line]
    assert len(refused) == 1 and refused[0].startswith("mqb: config.json refused, not running: "), out
