"""`--hmac-keys`: the Spark job verifies each batch's batch-hmac (docs/spark.md) before it
decodes it; a good, an unsigned, a tampered and an unknown device's batch on the shared
session, and the keys file's checks (its mode, its JSON, every key) without a JVM."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from mqbatch.spark import options as job_options
from mqbatch.wire import codec, integrity
from mqbatch_testing.spark import T0_MS, landed, sample, write_landing

KEY_A = bytes(range(32))
KEY_Z = bytes(range(100, 132))  # dev-z signs, but the keys file does not hold its key


def _signed(topic: str, subs: list[bytes], received_ms: int, key: bytes, replaced: list[bytes] | None = None):
    props, payload = codec.encode_batch(subs)
    props = list(props) + [integrity.sign(key, topic, props, payload)]
    if replaced is not None:  # tampered: other (well-formed) records under the device's MAC
        payload = codec.encode_payload(replaced)
    return landed(topic, [], received_ms, props=props, payload=payload)


def _keys_file(tmp_path, keys: dict, mode: int = 0o600):
    path = tmp_path / "hmac-keys.json"
    path.write_text(json.dumps(keys), encoding="utf-8")
    os.chmod(path, mode)
    return path


@pytest.mark.spark
def test_good_unsigned_tampered_and_unknown_device_batches(spark, tmp_path):
    from mqbatch import spark as job

    a, z = "mqbatch/dev-a/telemetry", "mqbatch/dev-z/telemetry"
    subs = lambda first: [sample(1, s)[0] for s in range(first, first + 3)]  # noqa: E731
    rows = [
        _signed(a, subs(0), T0_MS + 1000, KEY_A),  # good: 3 records
        landed(a, subs(3), T0_MS + 2000),  # unsigned
        _signed(
            a,
            subs(6),
            T0_MS + 3000,
            KEY_A,  # tampered: temperatures changed
            replaced=[sample(1, s, temperature=3000)[0] for s in range(6, 9)],
        ),
        _signed(z, subs(0), T0_MS + 4000, KEY_Z),  # no key for dev-z
        landed("other/topic", subs(0), T0_MS + 5000),
    ]  # names no device: left to the topic check
    write_landing(tmp_path / "landing", "r1", 0, rows)
    keys = _keys_file(tmp_path, {"dev-a": KEY_A.hex(), "dev-b": KEY_Z.hex()})
    opts = job.JobOptions(hmac_keys=job_options.load_hmac_keys(str(keys)))
    report = job.run_batch(spark, str(tmp_path / "landing"), str(tmp_path / "out"), opts)

    q = spark.read.parquet(str(tmp_path / "out" / "quarantine")).collect()
    got = sorted((r["topic"], r["stage"], r["batch_status"], r["reason"]) for r in q)
    assert got == [
        (a, "batch", "discarded", "BATCH_HMAC_INVALID"),
        (a, "batch", "discarded", "BATCH_HMAC_MISSING"),
        (z, "batch", "discarded", "BATCH_HMAC_NO_KEY"),
        ("other/topic", "topic", "ok", "TOPIC_NOT_TELEMETRY"),
    ]
    details = {r["reason"]: r["detail"] for r in q}
    assert "dev-z" in details["BATCH_HMAC_NO_KEY"] and "no key" in details["BATCH_HMAC_NO_KEY"]
    assert "unsigned" in details["BATCH_HMAC_MISSING"]
    assert all(r["payload"] for r in q)  # the raw batch is kept
    recs = spark.read.parquet(str(tmp_path / "out" / "records")).collect()
    assert sorted((r["device"], r["seq"]) for r in recs) == [("dev-a", 0), ("dev-a", 1), ("dev-a", 2)]
    assert report["quarantine"]["by_reason"] == {
        "BATCH_HMAC_INVALID": 1,
        "BATCH_HMAC_MISSING": 1,
        "BATCH_HMAC_NO_KEY": 1,
        "TOPIC_NOT_TELEMETRY": 1,
    }
    assert report["batches"] == {"discarded": 3, "ok": 2}
    assert report["devices"]["dev-a"]["quarantined"] == 2 and report["devices"]["dev-z"]["quarantined"] == 1
    # report.json names the devices with a key, never a key
    assert report["options"]["hmac_keys"] == ["dev-a", "dev-b"]
    text = (tmp_path / "out" / "report.json").read_text()
    assert KEY_A.hex() not in text and KEY_Z.hex() not in text

    # without the option nothing changes: every batch on a device topic decodes (the tampered one too)
    plain = job.run_batch(spark, str(tmp_path / "landing"), str(tmp_path / "plain"), job.JobOptions())
    assert plain["quarantine"]["by_reason"] == {"TOPIC_NOT_TELEMETRY": 1}
    assert plain["records"]["received"] == 12
    assert "hmac_keys" not in plain["options"]


def test_keys_file_readable_by_others_is_refused(tmp_path):
    path = _keys_file(tmp_path, {"dev-a": KEY_A.hex()}, mode=0o644)
    with pytest.raises(SystemExit, match=r"readable or writable by others \(mode 0644\).*chmod 600"):
        job_options.load_hmac_keys(str(path))


@pytest.mark.parametrize(
    "content, message",
    [
        ("[1]", "must hold a JSON object"),
        ("{", "not readable JSON"),
        ('{"dev-a": "abc"}', "device 'dev-a': hmac_key is not hex"),
        ('{"dev-a": "00ff"}', "device 'dev-a': hmac_key of 2 bytes: must be 16..64 bytes"),
        ('{"a/b": "' + "00" * 32 + '"}', "device id 'a/b' has '/': a device id is 1..64 characters"),
    ],
)
def test_bad_keys_file_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "k.json"
    path.write_text(content)
    os.chmod(path, 0o600)
    with pytest.raises(SystemExit, match=message.replace("(", r"\(").replace(")", r"\)")):
        job_options.load_hmac_keys(str(path))


def test_keys_are_checked_before_a_jvm_and_kept_out_of_repr(tmp_path):
    """check_paths (run by `mqbatch spark` before spark-submit) reads the keys file; the
    options carry (device, key bytes) pairs, hashable, and their repr holds no key."""
    p = argparse.ArgumentParser()
    job_options.add_arguments(p)
    (tmp_path / "landing").mkdir()
    bad = _keys_file(tmp_path, {"dev-a": KEY_A.hex()}, mode=0o640)
    args = p.parse_args(
        ["--landing", str(tmp_path / "landing"), "--out", str(tmp_path / "out"), "--hmac-keys", str(bad)]
    )
    with pytest.raises(SystemExit, match="readable or writable by others"):
        job_options.check_paths(args)
    os.chmod(bad, 0o600)
    job_options.check_paths(args)
    opts = job_options.options_from(args)
    assert opts.hmac_keys == (("dev-a", KEY_A),)
    assert hash(opts) == hash(job_options.options_from(args))
    assert KEY_A.hex() not in repr(opts) and "hmac_keys" not in repr(opts)
    from mqbatch.spark.submit import job_arguments

    assert job_arguments(args)[-2:] == ["--hmac-keys", str(bad)]


def test_local_stack_gives_each_device_a_key_in_its_config_and_a_0600_keys_file(tmp_path):
    """LocalStack (the demo, `mqbatch devices`): 32 random bytes per device, written into
    each virtual device's config.json and into the Spark job's --hmac-keys file (0600)."""
    import stat

    from mqbatch.lab.devices import DEFAULT_HEAP, Fleet
    from mqbatch.lab.stack import LocalStack

    stack = LocalStack(tmp_path / "stack", ["dev-001", "dev-002"])
    assert stat.S_IMODE(stack.hmac_keys_file.stat().st_mode) == 0o600
    assert dict(job_options.load_hmac_keys(str(stack.hmac_keys_file))) == stack.hmac_keys
    assert {len(k) for k in stack.hmac_keys.values()} == {32} and len(set(stack.hmac_keys.values())) == 2
    fleet = Fleet(
        tmp_path / "devices", "127.0.0.1", 1, credentials=stack.credentials, ca=stack.ca_cert, hmac_keys=stack.hmac_keys
    )
    for dev, key in stack.hmac_keys.items():
        cfg = json.loads((fleet.dir(dev) / "config.json").read_text())
        assert integrity.parse_key(cfg["hmac_key"]) == key
        assert stat.S_IMODE((fleet.dir(dev) / "config.json").stat().st_mode) == 0o600
    unsigned = Fleet(tmp_path / "plain", "127.0.0.1", 1, credentials={"dev-001": "pw"}, tls=False)
    assert "hmac_key" not in json.loads((unsigned.dir("dev-001") / "config.json").read_text())
    assert fleet.heapsize == unsigned.heapsize == DEFAULT_HEAP  # signing needs no bigger heap than unsigned


class _Keys(tuple):
    """A keys tuple that counts how often it is hashed or walked in full."""

    hashed = walked = 0

    def __hash__(self):
        _Keys.hashed += 1
        return super().__hash__()

    def __iter__(self):
        _Keys.walked += 1
        return super().__iter__()


def test_the_keys_are_looked_up_not_hashed_per_batch():
    """batch_hmac.check runs once per landed PUBLISH. Its {device: key} map was cached by
    the keys tuple's value (functools.lru_cache), which hashed every (device, key) pair on
    every call: 174 us per PUBLISH with 10,000 devices, more than the decoding (docs/spark.md).
    Now the map is built once per keys tuple and looked up; the verdicts are unchanged. With
    the old cache this fails (the tuple hashed 1,000 times)."""
    from mqbatch.spark import batch_hmac

    keys = _Keys((f"dev-{i:05d}", bytes([i % 256]) * 32) for i in range(10_000))
    topic = "mqbatch/dev-00007/telemetry"
    props, payload = codec.encode_batch([sample(1, 0)[0]])
    signed = list(props) + [integrity.sign(bytes([7]) * 32, topic, props, payload)]
    _Keys.hashed = _Keys.walked = 0
    verdicts = [batch_hmac.check(keys, topic, signed if i % 2 else props, payload) for i in range(1000)]
    assert verdicts[1] is None and verdicts[0][0] == integrity.MISSING
    assert all(v == verdicts[i % 2] for i, v in enumerate(verdicts))
    assert (_Keys.hashed, _Keys.walked) == (0, 1), (_Keys.hashed, _Keys.walked)
