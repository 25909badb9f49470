"""WORKER-LAZY: ``import worker`` imports each public name on first use, so that a process that only
uses ``worker.isolated`` (an isolated call's template and the calls it forks: TOOL-WARM) holds no
event loop, ZeroMQ or turn runner; the zygote still imports everything before it forks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import worker
from worker import lowlevel

ROOT = str(Path(__file__).parent.parent)
# What a worker's turns need and an isolated call does not.
HEAVY = ("zmq", "anyio", "asyncio", "psutil", "wire", "worker._turn", "worker._loop", "worker._connection")


def _fresh(code: str) -> object:
    """What ``code`` prints as JSON in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, cwd=ROOT, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_importing_worker_and_decorating_a_function_imports_no_turn_machinery() -> None:
    """A fresh interpreter's ``import worker`` and ``@worker.isolated`` import none of ``HEAVY``."""
    loaded = _fresh(
        "import json, sys, worker\n"
        "plain = sorted(sys.modules)\n"
        "@worker.isolated\n"
        "def f() -> None: ...\n"
        f"print(json.dumps([plain, [m for m in {HEAVY!r} if m in sys.modules]]))\n"
    )
    assert isinstance(loaded, list)
    plain, heavy = loaded
    assert heavy == []
    assert not [m for m in plain if m.startswith("worker.")]  # the package alone: nothing of it yet


def test_a_calls_process_forked_by_its_template_holds_no_turn_machinery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TOOL-WARM: the template imports a tool module that imports ``worker``; what it forks (the first
    call, then an embryo's) has none of ``HEAVY`` imported."""
    (tmp_path / "light_tools_t29.py").write_text(
        "import sys\n\nimport worker\n\n\n"
        "@worker.isolated\ndef modules() -> list[str]:\n    return sorted(sys.modules)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import light_tools_t29  # type: ignore[import-not-found]

    lowlevel.tool_templates(True)
    try:
        first, second = light_tools_t29.modules(), light_tools_t29.modules()
        tpl = lowlevel.tool_template_pid("fn")
        assert tpl is not None
    finally:
        lowlevel.tool_templates(None)
    assert "light_tools_t29" in first and "worker._isolated" in first  # (forked by the template)
    assert [m for m in HEAVY if m in first] == []
    assert [m for m in HEAVY if m in second] == []


def test_every_public_name_and_star_import_still_work() -> None:
    """``from worker import *`` binds every name of ``__all__``; an unknown name is an AttributeError."""
    names = _fresh(
        "import json\nfrom worker import *\nimport worker\n"
        "print(json.dumps([n for n in worker.__all__ if n in globals() and n in dir(worker)]))\n"
    )
    assert names == worker.__all__
    with pytest.raises(AttributeError, match="no_such_name"):
        worker.no_such_name  # noqa: B018 - the attribute access is the test


def test_the_zygote_imports_every_public_name_before_it_forks() -> None:
    """WORKER-LAZY, WORKER-SETTLE: after the zygote's preload, using every public name, a first isolated
    call (sync and async) and a first command import nothing more and write nothing to the package (a
    worker forked from it would pay for both)."""
    after = _fresh(
        # (the zygote's own preload: lowlevel would import more)
        "import json, sys\nfrom worker import _zygote\n_zygote._preload([])\nimport worker\n"
        "before, bound = set(sys.modules), set(vars(worker))\n"
        "for n in worker.__all__: getattr(worker, n)\n"
        "import anyio\n"
        "assert worker.isolated(lambda: 7)() == 7 and worker.run_command(['true']).returncode == 0\n"
        "assert anyio.run(worker.isolated(lambda: 8).acall) == 8\n"
        "print(json.dumps([sorted(set(sys.modules) - before), sorted(set(vars(worker)) - bound),"
        f" [m for m in {HEAVY!r} if m not in sys.modules]]))\n"
    )
    assert after == [[], [], []]
