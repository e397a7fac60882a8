# The two commands of the README. Each sets itself up (tools/bootstrap.sh).
.PHONY: demo test setup bench clean

demo: setup
	.venv/bin/mqbatch demo

# -v: each test's name shows while it runs; --durations: the slowest at the end.
# MQBATCH_REQUIRE_WASM32: the 32-bit MicroPython (setup installs it) must run, not skip.
test: setup
	MQBATCH_REQUIRE_WASM32=1 .venv/bin/python -m pytest -v --durations=15 $(PYTEST_ARGS)

setup:
	@tools/bootstrap.sh

bench: setup
	.venv/bin/mqbatch bench all

clean:
	rm -rf .venv build run .pytest_cache .hypothesis
