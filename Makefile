# The two commands of the README. Each sets itself up (tools/bootstrap.sh).
.PHONY: demo test test-fast test-long setup spark-prepare bench wheel clean

demo: setup
	.venv/bin/mqbatch demo

# -v: each test's name shows while it runs; --durations: the slowest at the end.
# MQBATCH_REQUIRE_WASM32: the 32-bit MicroPython (setup installs it) must run, not skip.
# -n: parallel workers (pytest-xdist; most tests wait on brokers, devices and JVMs; fresh
# clone, 2 cores: 438-583 s of pytest with 4 workers (2026-11-27), docs/testing.md has the runs);
# PYTEST_WORKERS=0 runs them one by one.
PYTEST_WORKERS ?= 4
# `long` tests (minutes each; a shorter test here checks the same property) run in test-long.
test: setup spark-prepare
	MQBATCH_REQUIRE_WASM32=1 MQBATCH_REQUIRE_CDS=1 .venv/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -v --durations=15 -m "not long" $(PYTEST_ARGS)

# The long scenarios left out of `make test` (docs/testing.md), with the full-size differentials and fuzzing.
test-long: setup spark-prepare
	MQBATCH_REQUIRE_WASM32=1 MQBATCH_REQUIRE_CDS=1 MQBATCH_JVM_DIFF_CASES=20000 MQBATCH_VDECODE_CASES=100000 MQBATCH_FUZZ_EXAMPLES=5000 .venv/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -v --durations=15 -m "long or slow or scaled" $(PYTEST_ARGS)

# The fast tier (docs/testing.md): the most important check of each area; budget 3 min on 2 cores.
test-fast: setup
	MQBATCH_REQUIRE_WASM32=1 .venv/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --durations=15 -m fast $(PYTEST_ARGS)

setup:
	@tools/bootstrap.sh

# The Spark JVM's class-data archive (mqbatch.spark.cds), written once (about 60-80 s on 2 cores;
# then "prepared already"): every JVM the tests start maps it and starts with about 10 s less
# CPU; MQBATCH_REQUIRE_CDS makes a test that finds none fail instead of skip. C1 only, as the
# tests' JVMs (tests/conftest.py): the archive holds classes, not compiled code.
spark-prepare: setup
	@SPARK_SUBMIT_OPTS=-XX:TieredStopAtLevel=1 .venv/bin/mqbatch spark --prepare

bench: setup
	.venv/bin/mqbatch bench all

# The wheel in dist/, with the Spark job's JVM fast path compiled inside (setup.py; needs the
# venv's PySpark and a JDK): installed next to the same PySpark, a JRE is enough.
wheel: setup
	MQBATCH_WHEEL_JVM=require .venv/bin/python -m pip wheel -q --no-deps --no-build-isolation --disable-pip-version-check -w dist .

clean:
	rm -rf .venv build dist run .pytest_cache .hypothesis
