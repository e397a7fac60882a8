"""The house rules, checked in `make test` (docs/architecture.md):

- the import contracts of pyproject.toml ([tool.importlinter]): the product never
  imports the lab, and each package imports only the ones below it;
- ruff (lint and format) over the repository, mypy over the product packages;
- commands stay thin.

Each check is also shown to fail on a broken input, so a green run means something."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from mqbatch.util.paths import ROOT

BIN = ROOT / ".venv" / "bin"
PRODUCT = ["wire", "ingest", "spark", "fleet", "report", "util"]
HOST = ROOT / "host"


def tool(name: str) -> str:
    exe = BIN / name
    if not exe.exists():
        found = shutil.which(name)
        if not found:
            pytest.fail(f"{name} is not installed: run `make setup` (pyproject.toml [test] pins it)")
        return found
    return str(exe)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)


@pytest.mark.fast
def test_import_contracts_are_kept():
    r = run([tool("lint-imports"), "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=HOST)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout, r.stdout


@pytest.mark.parametrize(
    "module, line, contract",
    [
        ("wire/codec.py", "import mqbatch.lab.broker", "the product never imports the lab"),
        ("ingest/landing.py", "from mqbatch.commands import spark", "the product never imports the lab"),
        ("wire/records.py", "import mqbatch.spark.schema", "layers"),
        ("lab/stack.py", "import mqbatch.scenarios.demo", "layers"),
    ],
)
def test_import_contracts_fail_on_a_forbidden_arrow(tmp_path, module, line, contract):
    """A copy of the package with one forbidden import added: lint-imports must break the contract."""
    copy = tmp_path / "mqbatch"
    shutil.copytree(HOST / "mqbatch", copy, ignore=shutil.ignore_patterns("__pycache__", "_device"))
    with open(copy / module, "a", encoding="utf-8") as f:
        f.write(f"\n{line}  # deliberately forbidden\n")
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    r = run([tool("lint-imports"), "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=tmp_path, env=env)
    assert r.returncode != 0, f"lint-imports kept every contract with {line!r} in {module}:\n{r.stdout}"
    broken = [ln for ln in r.stdout.splitlines() if ln.endswith("BROKEN")]
    assert any(contract in ln for ln in broken), r.stdout


@pytest.mark.fast
def test_ruff_lint_and_format_are_clean():
    lint = run([tool("ruff"), "check", "--no-cache", "."], cwd=ROOT)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = run([tool("ruff"), "format", "--check", "--no-cache", "."], cwd=ROOT)
    assert fmt.returncode == 0, "run `.venv/bin/ruff format .`:\n" + fmt.stdout + fmt.stderr


def test_ruff_fails_on_a_broken_file(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\ndef f():\n    return undefined_name\n")
    r = run([tool("ruff"), "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(bad)], cwd=tmp_path)
    assert r.returncode != 0 and "F401" in r.stdout and "F821" in r.stdout, r.stdout
    r = run([tool("ruff"), "format", "--check", "--no-cache", str(bad)], cwd=tmp_path)
    assert r.returncode == 0, r.stdout  # formatted as written
    bad.write_text("x = {  'a':1 }\n")
    r = run([tool("ruff"), "format", "--check", "--no-cache", str(bad)], cwd=tmp_path)
    assert r.returncode != 0, r.stdout


def mypy(*targets: str, cwd) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *targets], cwd=cwd)


@pytest.mark.fast
def test_mypy_passes_on_the_product_packages():
    r = mypy(*(f"mqbatch/{p}" for p in PRODUCT), cwd=HOST)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_fails_on_a_type_error(tmp_path):
    pkg = tmp_path / "mqbatch" / "wire"
    pkg.mkdir(parents=True)
    (pkg / "broken.py").write_text("def f(n: int) -> str:\n    return n + 1\n")
    r = mypy("mqbatch/wire/broken.py", cwd=tmp_path)
    assert r.returncode != 0 and "Incompatible return value" in r.stdout, r.stdout


COMMAND_LINES = 300  # a command parses, checks, delegates and prints: more than this and work has crept in


def test_commands_are_thin():
    fat = {
        p.name: n
        for p in (HOST / "mqbatch" / "commands").glob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > COMMAND_LINES
    }
    assert not fat, f"commands over {COMMAND_LINES} lines (move the work into its package): {fat}"


def test_architecture_doc_is_drawn_from_the_code(tmp_path):
    """docs/architecture.md's picture is current; a copy with one arrow removed is not."""
    from mqbatch.lab import architecture

    doc = ROOT / "docs" / "architecture.md"
    assert architecture.main(["--check", "--doc", str(doc)]) == 0, "run .venv/bin/python -m mqbatch.lab.architecture"
    stale = tmp_path / "architecture.md"
    text = doc.read_text(encoding="utf-8")
    arrow = next(line for line in text.splitlines() if "-->|" in line)
    stale.write_text(text.replace(arrow + "\n", ""), encoding="utf-8")
    assert architecture.main(["--check", "--doc", str(stale)]) == 1
