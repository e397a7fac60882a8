"""Issue 23.5 (E): one device-id rule (mqbatch.wire.device_id), used by `mqbatch fleet`;
the Spark job accepted `.`, `..` and upper-case ids that the fleet refused (the Spark
job is to switch to the same function: docs/security.md)."""

from __future__ import annotations

import pytest

from mqbatch.cli import main
from mqbatch.fleet import provision as fleet
from mqbatch.wire.device_id import MAX_DEVICE_ID, check_device_id, device_id_problem, is_device_id

GOOD = ["dev-001", "kitchen-1", "a", "0", "a.b_c-d", "x" * MAX_DEVICE_ID, "192.168.1.10"]
BAD = {
    ".": "starts with '.'",
    "..": "starts with '.'",
    ".hidden": "starts with '.'",
    "-rf": "starts with '-'",
    "_x": "starts with '_'",
    "Dev-1": "upper case",
    "DEV": "upper case",
    "": "is empty",
    "x" * (MAX_DEVICE_ID + 1): "65 characters",
    "a/b": "has '/'",
    "a+b": "has '+'",
    "a#": "has '#'",
    "a b": "has ' '",
    "d\u202eev": "has '\\u202e'",
    "dev\x00": "has '\\x00'",
}


@pytest.mark.parametrize("name", GOOD)
def test_good_ids(name):
    assert is_device_id(name) and device_id_problem(name) is None and check_device_id(name) == name


@pytest.mark.fast
@pytest.mark.parametrize("name,why", BAD.items())
def test_bad_ids_say_what_and_why(name, why):
    assert not is_device_id(name)
    problem = device_id_problem(name)
    assert problem is not None and why in problem and "a-z 0-9 _ . -" in problem, problem
    with pytest.raises(ValueError, match="device id"):
        check_device_id(name)


def test_fleet_uses_the_one_rule(tmp_path, capsys):
    for name in ("..", "Dev-1", ".", "-x"):
        with pytest.raises(fleet.FleetError, match="not usable: device id"):
            fleet.check_device_id(name)
    fleet.init(tmp_path / "f", ["127.0.0.1"], port=18883)
    assert main(["fleet", "add", str(tmp_path / "f"), "Kitchen-1"]) == 1
    assert "has upper case (ids are lower case: 'kitchen-1')" in capsys.readouterr().err
    assert main(["fleet", "add", str(tmp_path / "f"), "kitchen-1"]) == 0
