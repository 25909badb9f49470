"""The house habits hold together: one version everywhere, and the pre-commit hooks run exactly what
``make lint`` runs."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import supervisor

ROOT = Path(__file__).resolve().parent.parent


def test_one_version_in_the_package_the_command_and_the_docs() -> None:
    """pyproject.toml's ``version`` is the one source: the installed metadata, ``supervisor.__version__``
    and ``turnpool --version`` say the same, and no user doc names another ``turnpool X.Y.Z``."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version("turnpool") == declared
    assert supervisor.__version__ == declared
    shown = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == f"turnpool {declared}"
    docs = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = {m for path in docs for m in re.findall(r"\bturnpool (\d+\.\d+\.\d+\S*)", path.read_text())}
    assert named <= {declared}, named


def test_the_pre_commit_hooks_run_what_make_lint_runs() -> None:
    """``.pre-commit-config.yaml``'s hooks are local (no network) and run the same commands as the
    Makefile's ``lint`` target, with the checkout's own tools."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    lint = [line.strip().replace("$(BIN)/", ".venv/bin/") for line in recipe.splitlines()[1:] if line.strip()]
    config = (ROOT / ".pre-commit-config.yaml").read_text()
    assert re.findall(r"^\s*- repo: (\S+)", config, re.M) == ["local"]
    entries = re.findall(r"^\s*entry: (.+)$", config, re.M)
    assert lint == [
        ".venv/bin/ruff check .",
        ".venv/bin/ruff format --check .",
        ".venv/bin/mypy wire worker supervisor",
    ]
    # pre-commit passes the changed files instead of ``.``; mypy checks the packages whole.
    assert [e + " ." if "ruff" in e else e for e in entries] == lint
