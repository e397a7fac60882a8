"""mqbatch.fleet.brokerconf.Policy: identity bound to one account."""

from __future__ import annotations

import pytest

from mqbatch.fleet.brokerconf import Policy


def test_a_client_id_belongs_to_one_account():
    p = Policy()
    p.add_device("dev-001", "pw")
    with pytest.raises(ValueError, match="client id 'dev-001' belongs to account 'dev-001'"):
        p.add_recorder("recorder-x", "pw", client_id="dev-001")
    with pytest.raises(ValueError, match="account 'dev-001' exists already"):
        p.add_device("dev-001", "pw")
    p.add_recorder("recorder-1", "pw", client_id="rec-1")
    with pytest.raises(ValueError, match="belongs to account 'recorder-1'"):
        p.add_recorder("recorder-2", "pw", client_id="rec-1")
    assert sorted(p.accounts) == ["dev-001", "recorder-1"]
