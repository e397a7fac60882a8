"""The test tiers stay consistent (docs/testing.md): `make test-fast` (`-m fast`) holds the
most important check of every area, nothing is both `fast` and `slow`, and every marker the
suite uses is registered in pyproject.toml with a description.

The markers are read from a real collection of tests/ (a subprocess with
MQBATCH_DUMP_MARKERS, tests/conftest.py), so a marker lost in a refactor, a device module
renamed out of FAST_DEVICE_MODULES or a test file moved out of an area shows here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib

import pytest

from mqbatch_testing import ROOT
from mqbatch_testing.tiers import ALL_MARKERS

# area -> the test file that must hold at least one `fast` test
FAST_AREAS = {
    "codec vectors (host)": "tests/wire/test_codec_host.py",
    "codec (device)": "tests/mpy/mp_test_codec.py",
    "records (host)": "tests/wire/test_records.py",
    "records (device)": "tests/mpy/mp_test_record.py",
    "MQTT packets (device)": "tests/mpy/mp_test_mqtt_packet.py",
    "the firmware's bytes on 32 bits": "tests/mpy32/test_wasm32.py",
    "a firmware application run": "tests/firmware/test_app.py",
    "the MQTT client against a broker": "tests/firmware/test_mqtt_client.py",
    "recorder landing files": "tests/ingest/test_ingest_landing.py",
    "recorder end to end (acks)": "tests/ingest/test_ingest_e2e.py",
    "conformance self-test": "tests/conformance/test_selftest.py",
    "a Spark job run": "tests/spark/test_spark_job.py",
    "architecture (contracts, ruff, mypy)": "tests/test_architecture.py",
    "security (ACL, private files)": "tests/security/test_security_private.py",
    "deploy to a board": "tests/fleet/test_deploy.py",
    "CLI input checks": "tests/commands/test_cli_inputs.py",
    "test tiers": "tests/test_tiers.py",
}

# pytest's and its plugins' own markers (registered by them, not by pyproject.toml)
BUILTIN_MARKERS = {
    "parametrize",
    "skip",
    "skipif",
    "xfail",
    "usefixtures",
    "filterwarnings",
    "timeout",
    "xdist_group",
    "hypothesis",
}


def tier_problems(marks: dict[str, list[str]], registered: set[str], areas: dict[str, str]) -> list[str]:
    """One line per inconsistency in `marks` ({node id: marker names}, as collected)."""
    problems = []
    used = {m for names in marks.values() for m in names}
    for name in sorted(used - registered - BUILTIN_MARKERS):
        problems.append(f"marker {name!r} is used but not registered in pyproject.toml [tool.pytest.ini_options]")
    for name in sorted({"fast", "slow"} - registered):
        problems.append(f"marker {name!r} is not registered in pyproject.toml")
    for nodeid, names in sorted(marks.items()):
        if "fast" in names and "slow" in names:
            problems.append(f"{nodeid} is marked both fast and slow")
    fast_files = {nodeid.split("::", 1)[0] for nodeid, names in marks.items() if "fast" in names}
    files = {nodeid.split("::", 1)[0] for nodeid in marks}
    for area, path in sorted(areas.items()):
        if path not in files:
            problems.append(f"{area}: {path} has no tests (moved or renamed? update FAST_AREAS)")
        elif path not in fast_files:
            problems.append(f"{area}: {path} has no fast test")
    folders = {f.rsplit("/", 1)[0] for f in files if f.count("/") >= 2}
    for folder in sorted(folders):
        if not any(f.startswith(folder + "/") for f in fast_files):
            problems.append(f"{folder}/ has no fast test")
    return problems


def registered_markers(pyproject: str) -> set[str]:
    """The markers pyproject.toml registers with a description ("name: what it means")."""
    lines = tomllib.loads(pyproject)["tool"]["pytest"]["ini_options"]["markers"]
    return {line.split(":", 1)[0].strip() for line in lines if ":" in line and line.split(":", 1)[1].strip()}


@pytest.fixture(scope="module")
def collected(request, tmp_path_factory) -> dict[str, list[str]]:
    """The session's own collection when it was the whole of tests/ (`make test`, `make
    test-fast`: conftest keeps it before -m deselects), else a --collect-only run of tests/."""
    whole = request.config.stash.get(ALL_MARKERS, None)
    if whole:
        return whole
    dump = tmp_path_factory.mktemp("tiers") / "marks.json"
    env = dict(os.environ, MQBATCH_DUMP_MARKERS=str(dump))
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and dump.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(dump.read_text())


@pytest.mark.fast
def test_the_fast_tier_covers_every_area_and_every_marker_is_registered(collected):
    problems = tier_problems(
        collected, registered_markers((ROOT / "pyproject.toml").read_text(encoding="utf-8")), FAST_AREAS
    )
    assert not problems, "\n".join(problems)
    fast = [n for n, names in collected.items() if "fast" in names]
    slow = [n for n, names in collected.items() if "slow" in names]
    print(f"\n{len(collected)} tests: {len(fast)} fast, {len(slow)} slow")
    # the tiers are tiers: the fast one is a small part of the suite, `not slow` is not all of it
    assert 0 < len(fast) < len(collected) // 3 and slow


@pytest.mark.fast
def test_the_tier_checker_sees_each_kind_of_inconsistency():
    areas = {"codec": "tests/wire/test_codec.py", "spark": "tests/spark/test_job.py"}
    good = {
        "tests/wire/test_codec.py::test_a": ["fast"],
        "tests/wire/test_codec.py::test_b": ["parametrize"],
        "tests/spark/test_job.py::test_c": ["fast", "xdist_group"],
        "tests/spark/test_job.py::test_d": ["slow"],
        "tests/test_tiers.py::test_e": [],
    }
    assert tier_problems(good, {"fast", "slow"}, areas) == []

    no_fast = dict(good, **{"tests/spark/test_job.py::test_c": ["xdist_group"]})
    assert tier_problems(no_fast, {"fast", "slow"}, areas) == [
        "spark: tests/spark/test_job.py has no fast test",
        "tests/spark/ has no fast test",
    ]
    both = dict(good, **{"tests/spark/test_job.py::test_d": ["slow", "fast"]})
    assert tier_problems(both, {"fast", "slow"}, areas) == [
        "tests/spark/test_job.py::test_d is marked both fast and slow"
    ]
    typo = dict(good, **{"tests/wire/test_codec.py::test_b": ["fsat"]})
    assert tier_problems(typo, {"fast", "slow"}, areas) == [
        "marker 'fsat' is used but not registered in pyproject.toml [tool.pytest.ini_options]"
    ]
    assert tier_problems(good, {"fast"}, areas) == [
        "marker 'slow' is used but not registered in pyproject.toml [tool.pytest.ini_options]",
        "marker 'slow' is not registered in pyproject.toml",
    ]
    moved = {k.replace("test_codec", "test_codec_host"): v for k, v in good.items()}
    assert tier_problems(moved, {"fast", "slow"}, areas) == [
        "codec: tests/wire/test_codec.py has no tests (moved or renamed? update FAST_AREAS)"
    ]
    other_folder = dict(good, **{"tests/ingest/test_landing.py::test_f": []})
    assert tier_problems(other_folder, {"fast", "slow"}, areas) == ["tests/ingest/ has no fast test"]


@pytest.mark.fast
def test_a_marker_counts_as_registered_only_with_a_description():
    assert {"fast", "slow", "broker", "spark"} <= registered_markers((ROOT / "pyproject.toml").read_text("utf-8"))
    text = '[tool.pytest.ini_options]\nmarkers = ["fast: the fast tier", "slow:", "spark"]\n'
    assert registered_markers(text) == {"fast"}


def grouping_problems(verbose_output: str, group: str) -> list[str]:
    """From `pytest -n N --dist loadgroup -v` output: what is wrong with the tests of
    `group` (each must be reported as NODEID@group, all from one worker)."""
    runs = re.findall(r"^\[(gw\d+)\] \[ *\d+%\] PASSED (\S+)", verbose_output, re.M)
    if not runs:
        return ["no test passed"]
    problems = [
        f"{nodeid} is not reported as part of group {group!r}" for _, nodeid in runs if not nodeid.endswith("@" + group)
    ]
    workers = sorted({w for w, _ in runs})
    if len(workers) > 1:
        problems.append(f"group {group!r} ran on {len(workers)} workers: {', '.join(workers)}")
    return problems


def run_grouped(env_extra: dict) -> str:
    env = dict(os.environ, **env_extra)
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider"]
        + ["-p", "no:hypothesispytest"]  # (1.5 s of CPU per process to import; no hypothesis test runs here)
        + ["tests/test_tiers.py", "-k", "checker_sees or only_with_a_description"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_an_xdist_group_runs_on_one_worker():
    """`make test`'s --dist loadgroup keeps a group (one SparkSession, one wheel build) on one
    worker. With pytest 9 it did not (tests/conftest.py name_group): the same run without
    the group names shows the tests of tests/test_tiers.py outside their group."""
    assert grouping_problems(run_grouped({}), "tiers") == []
    broken = grouping_problems(run_grouped({"MQBATCH_TEST_NO_GROUP_NAMES": "1"}), "tiers")
    assert any("is not reported as part of group 'tiers'" in p for p in broken), broken
