"""Issue 10, finding 8: no file we write holds a secret readable by others. Private
keys, the password file, the ACL and the dynamic-security policy (password hashes)
are 0600, also when a file of that name existed with wider permissions; the
broker still starts with them (it runs as the same user)."""

from __future__ import annotations

import os
import stat

import pytest

from mqbatch.lab.broker import Mosquitto
from mqbatch.lab.stack import LocalStack

pytestmark = pytest.mark.broker


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_secrets_are_owner_only_and_the_broker_reads_them(tmp_path):
    stale = tmp_path / "stack" / "broker"
    stale.mkdir(parents=True)
    (stale / "dynamic-security.json").write_text("{}")
    os.chmod(stale / "dynamic-security.json", 0o644)  # left by an older run
    stack = LocalStack(tmp_path / "stack", ["dev-001"])
    secret = [
        stack.pki.ca.key,
        stack.pki.server.key,
        stack.pki.server.key_der,
        stack.pki.client("recorder").key,
        stack.broker.directory / "dynamic-security.json",
    ]
    public = [stack.pki.ca_cert, stack.pki.server.cert]
    legacy = Mosquitto(tmp_path / "legacy", users={"a": "pw"}, acl="user a\ntopic write x\n")
    secret += [legacy.directory / "passwd", legacy.directory / "acl"]
    modes = {p.name: oct(mode(p)) for p in secret + public}
    print(modes)
    assert all(mode(p) == 0o600 for p in secret), modes
    assert all(mode(p) == 0o600 for p in public), modes  # public, yet private at rest (issue 23.4)
    with stack.broker, legacy:
        assert stack.broker.running and legacy.running
