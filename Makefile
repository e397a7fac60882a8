# The two commands of the README. Each sets itself up (tools/bootstrap.sh).
.PHONY: demo test setup bench clean

demo: setup
	.venv/bin/mqbatch demo

test: setup
	.venv/bin/python -m pytest $(PYTEST_ARGS)

setup:
	@tools/bootstrap.sh

bench: setup
	.venv/bin/python tools/bench.py

clean:
	rm -rf .venv build run .pytest_cache .hypothesis
