"""Where tests/conftest.py keeps the markers of the whole collection for tests/test_tiers.py."""

import pytest

# {node id: marker names} of every collected test, before -m/-k deselect any; set only when
# the session collected the whole of tests/ (otherwise tests/test_tiers.py collects it itself)
ALL_MARKERS = pytest.StashKey[dict]()
