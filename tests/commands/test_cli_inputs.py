"""Every CLI input is checked before anything starts: nonsense gets one clear line
(what and why, naming the flag), exit status 2 (usage) or 1, never a traceback;
a folder the user owns is never deleted."""

import json
import subprocess
import time

import pytest

from mqbatch_testing import VENV_BIN


def mqbatch(*args, timeout=60, **kw) -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(VENV_BIN / "mqbatch"), *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw
    )
    proc.seconds = time.monotonic() - t0
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    return proc


@pytest.mark.parametrize(
    "args, flag, why",
    [
        (["demo", "--devices", "0"], "--devices", "must be >= 1 (a whole number), got 0"),
        (["demo", "--devices", "two"], "--devices", "expected a whole number >= 1, got 'two'"),
        (["demo", "--sample-hz", "0"], "--sample-hz", "must be > 0, got 0"),
        (["demo", "--duration", "-5"], "--duration", "must be > 0, got -5"),
        (["demo", "--outage-s", "-1"], "--outage-s", "must be >= 0"),
        (["demo", "--duration", "nan"], "--duration", "expected a number > 0, got 'nan'"),
        (["devices", "--count", "0"], "--count", "must be >= 1 (a whole number), got 0"),
        (["devices", "--sample-hz", "0"], "--sample-hz", "must be > 0"),
        (["devices", "--broker", "localhost"], "--broker", "expected HOST:PORT"),
        (["devices", "--broker", "127.0.0.1:99999"], "--broker", "expected HOST:PORT with a port 1..65535"),
        (["decode", "--max-batch-size", "abc"], "--max-batch-size", "expected a whole number >= 1, got 'abc'"),
        (["ingest", "--landing", "x", "--receive-maximum", "0"], "--receive-maximum", "must be >= 1 (a whole number)"),
        (["ingest", "--landing", "x", "--port", "88830"], "--port", "expected a TCP port 1..65535, got 88830"),
        (["ingest", "--landing", "x", "--progress-seconds", "0"], "--progress-seconds", "must be > 0"),
        (["ingest", "--landing", "x", "--roll-seconds", "-1"], "--roll-seconds", "must be > 0"),
        # issue 26: each was found by a reviewer failing late or without naming its flag
        (["demo", "--heapsize", "12Q"], "--heapsize", "expected a size like 96K or 1M"),
        (["demo", "--heapsize", "32K"], "--heapsize", "must be at least 64K"),
        (["devices", "--heapsize", "lots"], "--heapsize", "expected a size like 96K or 1M"),
        (["ingest", "--landing", "x", "--password-file", "/nonexistent/pw"], "--password-file", "no such file"),
        (["ingest", "--landing", "/etc/hostname"], "--landing", "/etc/hostname is not a directory"),
        (
            ["ingest", "--landing", "/etc/hostname/sub"],
            "--landing",
            "/etc/hostname/sub is under /etc/hostname, which is not a",
        ),
        (["fleet", "add", "x", "d1", "--wifi-password-file", "/nonexistent/w"], "--wifi-password-file", "no such"),
    ],
)
@pytest.mark.fast
def test_nonsense_arguments_are_refused_with_a_sentence(args, flag, why):
    proc = mqbatch(*args)
    assert proc.returncode == 2, proc.stderr
    assert f"argument {flag}: {why}" in proc.stderr, proc.stderr
    assert "_positive" not in proc.stderr and "invalid" not in proc.stderr
    assert proc.seconds < 20, "refused before starting anything"


def test_demo_sample_rate_above_the_firmware_limit_is_refused_before_anything_starts(tmp_path):
    proc = mqbatch("demo", "--sample-hz", "5000", "--run-dir", tmp_path / "demo")
    assert proc.returncode == 2  # an input error: exit status 2, like argparse's
    assert "--sample-hz must be in (0, 1000]" in proc.stderr and "firmware" in proc.stderr
    assert not (tmp_path / "demo").exists()


def test_demo_refuses_a_run_dir_it_did_not_make_and_deletes_nothing(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    proc = mqbatch("demo", "--devices", "1", "--duration", "5", "--run-dir", mine)
    assert proc.returncode == 2
    assert (mine / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in mine.iterdir()) == ["thesis.tex"]
    assert f"{mine} is not empty and was not made by mqbatch" in proc.stderr and "--run-dir" in proc.stderr


def test_a_file_given_as_run_dir_is_refused(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("keep")
    proc = mqbatch("demo", "--run-dir", f)
    assert proc.returncode == 2 and f.read_text() == "keep"
    assert "exists and is not a plain directory" in proc.stderr


def test_devices_with_broker_needs_credentials_and_ca_named_as_flags(tmp_path):
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps({"dev-001": "pw"}))
    proc = mqbatch("devices", "--count", "1", "--broker", "127.0.0.1:8883", "--credentials", creds, "--dir", tmp_path)
    assert proc.returncode == 2
    assert "--ca FILE" in proc.stderr and "ca=..." not in proc.stderr
    proc = mqbatch(
        "devices",
        "--count",
        "1",
        "--broker",
        "127.0.0.1:8883",
        "--ca",
        tmp_path / "nope.pem",
        "--credentials",
        creds,
        "--dir",
        tmp_path,
    )
    assert proc.returncode == 2 and "--ca" in proc.stderr and "no such file" in proc.stderr
    proc = mqbatch("devices", "--count", "1", "--broker", "127.0.0.1:8883", "--plain", "--dir", tmp_path)
    assert proc.returncode == 2 and "--broker needs --credentials" in proc.stderr


@pytest.mark.parametrize(
    "content, why",
    [
        ("{not json", "is not valid JSON"),
        ('["dev-001", "pw"]', "must hold a JSON object, got list"),
        ('{"dev-001": 42}', "the password of dev-001 must be a JSON string"),
        ('{"dev-009": "pw"}', "has no password for dev-001"),
    ],
)
def test_devices_bad_credentials_file_is_one_clear_line(tmp_path, content, why):
    creds = tmp_path / "creds.json"
    creds.write_text(content)
    proc = mqbatch(
        "devices", "--count", "1", "--broker", "127.0.0.1:8883", "--plain", "--credentials", creds, "--dir", tmp_path
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("devices: ") and why in proc.stderr, proc.stderr


def test_devices_missing_credentials_file(tmp_path):
    proc = mqbatch(
        "devices",
        "--count",
        "1",
        "--broker",
        "127.0.0.1:8883",
        "--plain",
        "--credentials",
        tmp_path / "missing.json",
        "--dir",
        tmp_path,
    )
    assert proc.returncode == 2 and "cannot read --credentials" in proc.stderr and "No such file" in proc.stderr


def test_decode_missing_file(tmp_path):
    proc = mqbatch("decode", tmp_path / "nope.jsonl")
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"decode: cannot read {tmp_path / 'nope.jsonl'}: No such file or directory"


def test_old_positive_type_name_still_importable():
    from mqbatch.commands.decode import _positive

    assert _positive("3") == 3


def test_a_misspelt_flag_shows_the_commands_usage_not_the_top_level_one():
    proc = mqbatch("demo", "--devcies", "2")
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: mqbatch demo ") and "--heapsize" in proc.stderr, proc.stderr
    assert "mqbatch demo: error: unrecognized arguments: --devcies 2" in proc.stderr
    proc = mqbatch("fleet", "add", "x", "d1", "--bord", "esp32")
    assert proc.returncode == 2 and proc.stderr.startswith("usage: mqbatch fleet add "), proc.stderr


def test_demo_heapsize_is_checked_before_the_run_starts(tmp_path):
    """`demo --heapsize 12Q` ran the whole minute, then failed without naming the flag."""
    proc = mqbatch("demo", "--heapsize", "12Q", "--run-dir", tmp_path / "demo")
    assert proc.returncode == 2 and "argument --heapsize" in proc.stderr
    assert not (tmp_path / "demo").exists() and proc.seconds < 20


@pytest.mark.parametrize(
    "board, extra, flag",
    [
        ("esp32", [], "--wifi-ssid"),
        ("rp2040", [], "--wifi-ssid"),
        ("esp32", ["--wifi-ssid", "home"], "--wifi-password-file"),  # no terminal to ask on
        ("esp32", ["--wifi-ssid", "home", "--wifi-password-file", "EMPTY"], "--wifi-password-file"),
    ],
)
def test_fleet_add_refuses_a_wifi_board_without_its_credentials(tmp_path, board, extra, flag):
    """`fleet add --board esp32` without --wifi-ssid exited 0 and wrote the template's
    your-ssid / your-wifi-password, which never connect."""
    fleet = tmp_path / "fleet"
    assert mqbatch("fleet", "init", fleet, "--broker-host", "127.0.0.1").returncode == 0
    (tmp_path / "empty.txt").write_text("\n")
    extra = [str(tmp_path / "empty.txt") if x == "EMPTY" else x for x in extra]
    proc = mqbatch("fleet", "add", fleet, "porch-1", "--board", board, *extra, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and flag in proc.stderr and board in proc.stderr
    assert not (fleet / "devices" / "porch-1").exists()
    assert "porch-1" not in "".join(p.read_text(errors="replace") for p in fleet.rglob("*") if p.is_file())
