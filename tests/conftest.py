"""Shared pytest set-up.

MicroPython tests: files tests/mpy/mp_test_*.py are MicroPython modules. Each
top-level `def test_*` becomes one pytest item that runs in the real Unix-port
interpreter (`micropython` from the venv) through tests/mpy/mpyunit.py. They are
never imported into CPython.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess

import pytest

from mqbatch.spark import cds
from mqbatch_testing import MICROPYTHON, ROOT, mpy_env
from mqbatch_testing.tiers import ALL_MARKERS

pytest_plugins = ["mqbatch_testing.fixtures", "mqbatch_testing.broker", "mqbatch_testing.spark"]

# Every JVM the tests start (the shared SparkSessions, each spark-submit a test runs, the
# bench smoke run) compiles with C1 only: their data is small, so most of their CPU went to
# C2 compiling code that then ran for a moment (tests/spark/test_jvm_decode.py alone: 144 s
# of CPU -> 95 s, 2 cores, idle). Same code paths, same results; spark-submit reads the
# variable (checked by tests/spark/test_spark_job.py). Products and `make bench` keep the
# JVM's default JIT; `mqbatch bench` prints the options when they are set.
TEST_JVM_OPTS = "-XX:TieredStopAtLevel=1"
# ... and maps the JVM's class-data archive of this checkout (mqbatch.spark.cds; `make test`
# writes it first with `mqbatch spark --prepare`): a JVM's start-up then takes about 10 s
# less CPU. Installed copies of mqbatch that tests make use the same archives (MQBATCH_JVM_CDS).
os.environ.setdefault("MQBATCH_JVM_CDS", str(ROOT / "build" / "cds"))
if "SPARK_SUBMIT_OPTS" not in os.environ:  # (set: by the caller, or inherited by an xdist worker)
    # map_options() starts a JVM to see that the archive loads: once per run, not once per worker
    os.environ["SPARK_SUBMIT_OPTS"] = cds.with_options(cds.map_options(), TEST_JVM_OPTS)


# -- test tiers (docs/testing.md; checked by tests/test_tiers.py) --------------------------
# The device test modules whose every test is in the fast tier (`make test-fast`): the
# codec, the records and the MQTT packets, a few seconds each in the Unix port.
FAST_DEVICE_MODULES = ("mp_test_codec", "mp_test_record", "mp_test_mqtt_packet")
# The tests that use the shared SparkSession run on one worker per group (one JVM each):
# these files form a second group, so that the two longest Spark chains (the stream killed
# mid-batch, the JVM/Python differential) run beside the job's tests, not after them.
SPARK_SECOND_GROUP = ("tests/spark/test_spark_cli.py", "tests/spark/test_jvm_decode.py")
# Modules whose module-scoped fixtures are worth building once, not once per worker.
ONE_WORKER_MODULES = {
    "tests/test_wheel.py": "wheel",  # a wheel built, a venv made, installed
    "tests/test_tiers.py": "tiers",  # a --collect-only of tests/
}
# tests/mpy32/test_wasm32.py: the items of each device test module form a group (one worker).
WASM32_TESTS = "tests/mpy32/test_wasm32.py"
_NO_PARAMS = type("NoParams", (), {"params": {}})()
# Session fixtures worth running once: the tests that use one run on one worker.
ONE_WORKER_FIXTURES = {"bench_all_quick": "bench-all-quick"}  # tests/bench/conftest.py


class MpyFile(pytest.File):
    def collect(self):
        tree = ast.parse(self.path.read_text(encoding="utf-8"))
        fast = self.path.stem in FAST_DEVICE_MODULES
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                item = MpyItem.from_parent(self, name=node.name)
                if fast:
                    item.add_marker(pytest.mark.fast)
                yield item


class MpyFailure(Exception):
    pass


class MpyItem(pytest.Item):
    def runtest(self):
        module = self.path.stem
        heap = os.environ.get("MQBATCH_MPY_HEAP")
        cmd = (
            [str(MICROPYTHON)]
            + (["-X", f"heapsize={heap}"] if heap else [])
            + [str(ROOT / "tests" / "mpy" / "mpyunit.py"), module, self.name]
        )
        proc = subprocess.run(cmd, cwd=self.path.parent, env=mpy_env(), capture_output=True, text=True, timeout=600)
        # show what the test printed (figures, logs) in pytest's captured output
        print(proc.stdout, end="")
        if proc.stderr:
            print(proc.stderr, end="")
        if f"MPYTEST PASS {self.name}" not in proc.stdout:
            raise MpyFailure(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, MpyFailure):
            return f"MicroPython test failed: {excinfo.value}"
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, 0, f"[micropython] {self.name}"


def pytest_collect_file(parent, file_path: pathlib.Path):
    if file_path.suffix == ".py" and file_path.name.startswith("mp_test_"):
        return MpyFile.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test` runs `-n 3 --dist loadgroup`):

    - every test that uses the shared SparkSession runs on the worker of its Spark group:
      one JVM per group, not one per worker (two groups: SPARK_SECOND_GROUP);
    - the tests of ONE_WORKER_MODULES, and those using a fixture of ONE_WORKER_FIXTURES,
      run on one worker, so those fixtures are built once;
    - the `slow` tests outside a group, then the Spark groups, are handed out first (the
      longest first, the short ones fill in around them), so that no worker starts a
      minutes-long test near the end of the run.
    Without xdist the order is pytest's own."""
    if all(pathlib.Path(a.split("::")[0]).resolve() == ROOT / "tests" for a in config.args):
        config.stash[ALL_MARKERS] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if "spark" in getattr(item, "fixturenames", ()):
            group = "spark-session-2" if path in SPARK_SECOND_GROUP else "spark-session"
            item.add_marker(pytest.mark.xdist_group(group))
        elif path in ONE_WORKER_MODULES:
            item.add_marker(pytest.mark.xdist_group(ONE_WORKER_MODULES[path]))
        elif path == WASM32_TESTS and "module" in getattr(item, "callspec", _NO_PARAMS).params:
            # one node process runs a device test module's tests in the 32-bit port: all of a
            # module's items on one worker, so the module runs once, not once per worker
            item.add_marker(pytest.mark.xdist_group("wasm32-" + item.callspec.params["module"]))
        else:
            shared = [g for f, g in ONE_WORKER_FIXTURES.items() if f in getattr(item, "fixturenames", ())]
            if shared:
                item.add_marker(pytest.mark.xdist_group(shared[0]))
        if ALL_MARKERS in config.stash:
            config.stash[ALL_MARKERS][item.nodeid] = sorted({m.name for m in item.iter_markers()})
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=_hand_out_order)


def _hand_out_order(item) -> int:
    """0: a `slow` test outside a group; 1: a test of a Spark group (its JVM starts early, the
    group is a long chain on one worker); 2: the rest, in collection order (the sort is stable)."""
    if item.get_closest_marker("slow") and not item.get_closest_marker("xdist_group"):
        return 0
    return 1 if "spark" in getattr(item, "fixturenames", ()) else 2


NO_GROUP_NAMES = "MQBATCH_TEST_NO_GROUP_NAMES"  # set: as pytest-xdist alone does (tests/test_tiers.py)


def name_group(item) -> None:
    """`--dist loadgroup` schedules by node id: a test of group G must be reported as
    "NODEID@G". pytest-xdist 3.8 appends it to `item._nodeid`, which pytest 9 no longer reads
    (the id is `item._id`, a NodeId): every xdist_group was ignored and each worker started
    its own JVM. This names the group where pytest 9 reads it (tests/test_tiers.py checks that
    a group lands on one worker)."""
    from _pytest.nodeid import NodeId

    groups = sorted(
        {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    )
    if groups and not item.nodeid.endswith("@" + "_".join(groups)):
        item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(groups)}")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session):
    """In an xdist worker under --dist loadgroup: name each test's group (name_group), after
    -k/-m/--deselect chose the tests and before the worker reports its collection.
    MQBATCH_DUMP_MARKERS=<file>: write {node id: [marker names]} of the collected tests
    (tests/test_tiers.py checks the tiers from it)."""
    config = session.config
    if os.environ.get("PYTEST_XDIST_WORKER") and config.getvalue("loadgroup") and not os.environ.get(NO_GROUP_NAMES):
        for item in session.items:
            name_group(item)
    target = os.environ.get("MQBATCH_DUMP_MARKERS")
    if target:
        import json

        marks = {i.nodeid: sorted({m.name for m in i.iter_markers()}) for i in session.items}
        pathlib.Path(target).write_text(json.dumps(marks, indent=0))
