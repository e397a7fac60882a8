"""The scenario harness's count (mqbatch.scenarios.e2escenario.Result, issue 22): records
released unconfirmed that did not land are accounted, not lost; a counter that says too
little leaves records lost, one that says too much shows as negative loss."""

from __future__ import annotations

from mqbatch.scenarios.e2escenario import Result


def result(stored, landed, dropped, released):
    return Result("s", "firmware", True, 2, stored, landed, 0, dropped, [], {}, released)


def test_released_records_that_did_not_land_are_accounted_not_lost():
    r = result(1000, 970, 10, 25)  # 30 absent: 10 dropped, 20 of the 25 released did not land
    assert (r.released_not_landed, r.lost) == (20, 0)
    assert "released unconfirmed 25 (5 landed), LOST     0" in r.line()


def test_a_counter_that_says_too_little_or_too_much_shows():
    assert result(1000, 970, 10, 15).lost == 5  # released under-counted: 5 absent, counted by nobody
    assert result(1000, 970, 40, 0).lost == -10  # dropped over-counts (the accounting before issue 22)
