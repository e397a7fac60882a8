import subprocess

from mqbatch_testing import VENV_BIN


def test_demo_command_runs_device_encoder_and_host_decoder():
    proc = subprocess.run([str(VENV_BIN / "mqbatch"), "demo", "--records", "30"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "status=ok reason=None sub-messages=30" in proc.stdout
