"""A short version of the README's main command, end to end: broker with TLS/auth/ACL,
virtual devices running the firmware, a broker outage and a network cut, the recorder,
the Spark job, the summary and the HTML report. The demo exits non-zero if any
record a device stored on flash is missing from the curated table."""
import subprocess

from mqbatch_testing import VENV_BIN


def test_short_demo_end_to_end(tmp_path):
    run_dir = tmp_path / "demo"
    proc = subprocess.run([str(VENV_BIN / "mqbatch"), "demo", "--devices", "2", "--duration", "12",
                           "--outage-s", "3", "--cut-s", "2", "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    for step in range(1, 8):
        assert f"{step}/7 " in out
    assert "fault: broker outage" in out and "fault: network cut" in out
    assert "none lost" in out and "LOST" not in out
    html = (run_dir / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and html.count("<svg") == 4
    assert "No record lost" in html
    assert (run_dir / "spark-out" / "report.json").exists()
