"""Issue 23.4 (D): private at rest. Every folder mqbatch creates is 0700 and every file
0600, whatever the umask: the landing zone (rolled Parquet files were 0644 in 0755
folders), the fleet directory, the lab stack and broker, run folders. Checked under
a permissive umask (0o000, where a mode passed to mkdir/open is taken as is, and
the usual 0o022)."""

from __future__ import annotations

import os
import pathlib
import stat

import pytest

from mqbatch.fleet import provision as fleet
from mqbatch.ingest.landing import Landed, LandingWriter
from mqbatch.lab.stack import LocalStack
from mqbatch.util import private
from mqbatch.util.rundir import fresh_dir


@pytest.fixture(params=[0o000, 0o022], ids=["umask000", "umask022"])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def loose(root: pathlib.Path) -> dict[str, str]:
    """Everything under `root` (itself included) that is not 0700 (folders) / 0600 (files)."""
    bad = {}
    for p in [root, *root.rglob("*")]:
        if p.is_symlink():
            continue
        mode = stat.S_IMODE(p.stat().st_mode)
        if mode != (0o700 if p.is_dir() else 0o600):
            bad[str(p.relative_to(root.parent))] = oct(mode)
    return bad


@pytest.mark.fast
def test_the_checker_sees_a_loose_file(tmp_path):
    (tmp_path / "d").mkdir(mode=0o700)
    os.chmod(tmp_path / "d", 0o700)
    f = tmp_path / "d" / "f"
    f.write_text("x")
    os.chmod(f, 0o644)
    assert loose(tmp_path / "d") == {"d/f": "0o644"}


@pytest.mark.fast
def test_landing_zone_is_private(tmp_path, umask):
    root = tmp_path / "data"  # created by the writer, with a parent it creates too
    w = LandingWriter(root / "landing", "rec-1", roll_bytes=1 << 20)
    for i in range(3):
        w.append(Landed("mqbatch/d/telemetry", b"%d" % i, []))
        w.commit()
    assert w.roll_in_background()
    w.wait_rolled()
    w.append(Landed("mqbatch/d/telemetry", b"open", []))
    w.commit()  # an open WAL segment too
    names = {p.name for p in root.rglob("*")}
    assert "landing-rec-1-00000000.parquet" in names and "rec-1-00000001.wal" in names, names
    assert loose(root) == {}
    w.close()
    assert loose(root) == {}


def test_fleet_directory_is_private(tmp_path, umask):
    fleet.init(tmp_path / "fleet", ["127.0.0.1"], port=18883, mtls_port=18884)
    fleet.add(tmp_path / "fleet", ["dev-001"])
    fleet.add(tmp_path / "fleet", ["cert-1"], client_cert=True)
    fleet.remove(tmp_path / "fleet", ["cert-1"])  # writes the CRL
    assert loose(tmp_path / "fleet") == {}


def test_lab_stack_run_folders_and_private_helpers(tmp_path, umask):
    stack = LocalStack(tmp_path / "stack", ["dev-001"])
    stack.broker.start()
    stack.broker.stop()  # its log and persistence written too
    assert loose(tmp_path / "stack") == {}
    run = fresh_dir(tmp_path / "runs" / "demo", "mqbatch demo")
    assert loose(tmp_path / "runs") == {}
    assert run.is_dir()
    fd = private.open_private(tmp_path / "runs" / "x", os.O_WRONLY | os.O_CREAT)
    os.close(fd)
    private.write_private(tmp_path / "runs" / "y", "y")
    assert loose(tmp_path / "runs") == {}
