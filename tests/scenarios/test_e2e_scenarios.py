"""Issue 16's proof, short version (the long run: tools/e2e_scenarios.py, docs/reliability.md):
each fault scenario of mqbatch.scenarios.e2escenario against the real stack (Mosquitto, the
recorder as a child process), stored-on-device vs unique landed + counted dropped.
With end-to-end acks on nothing is lost; the same scenario with acks off is run and
printed next to it, and where the loss is deterministic it must show it (else the "0 lost"
of the on side would prove nothing)."""

from __future__ import annotations

import pytest

from mqbatch.scenarios.e2escenario import run_scenario

pytestmark = pytest.mark.broker


@pytest.mark.parametrize(
    "scenario, off_loses",
    [
        ("broker-kill-recorder-down", True),  # queued for the recorder, lost with the broker
        ("recorder-down-over-queue-limit", True),  # beyond max_queued_messages: dropped, PUBACKed
        ("broker-kills", None),  # 10 broker SIGKILLs at random moments: off loses what was
        # queued at each kill, which depends on timing (printed only)
        ("recorder-kills", False),  # WAL + fsync before PUBACK: nothing lost either way
        ("foreign-subscriber-acl-file", True),  # the pre-issue-10 broker config: the intruder's share dropped
        ("recorder-takeover-acl-file", True),  # ditto: the taken-over session's messages dropped
    ],
)
def test_virtual_devices_lose_nothing_with_e2e_acks(scenario, off_loses, tmp_path):
    on = run_scenario(scenario, tmp_path / "on", devices=2, kind="virtual", e2e=True, run_for_s=5)
    off = run_scenario(scenario, tmp_path / "off", devices=2, kind="virtual", e2e=False, run_for_s=5)
    print(on.line())
    print(off.line())
    assert on.stored > 0 and on.lost == 0, on.line()
    assert on.unique_landed == on.stored and all(
        s["left_in_outbox"] == 0 for d, s in on.device_stats.items() if d != "seed"
    )
    if off_loses:
        assert off.lost > 0, f"the scenario did not hit the loss it exists to show: {off.line()}"
    elif off_loses is False:
        assert off.lost == 0, off.line()


@pytest.mark.parametrize("e2e", [False, True])
def test_firmware_devices_broker_kill_while_the_recorder_is_down(e2e, tmp_path):
    """The real firmware (MicroPython Unix port): acks off shows the loss, acks on loses nothing."""
    r = run_scenario("broker-kill-recorder-down", tmp_path, devices=2, kind="firmware", e2e=e2e, run_for_s=8)
    print(r.line())
    assert r.stored > 0
    if e2e:
        assert r.lost == 0, r.line()
    else:
        assert r.lost > 0, f"the broker SIGKILL lost nothing acknowledged: {r.line()}"
