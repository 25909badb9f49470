"""The package layout's promises (issue 14): the public names stay as they are, the supervisor
reaches the worker only through ``worker.lowlevel``, front ends use only public engine names, and
no module imports another in a circle. Source checks, and one fresh interpreter (Ray stays out of
``import supervisor``)."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import supervisor
import supervisor.batch

ROOT = Path(__file__).resolve().parent.parent


def test_supervisor_public_names_are_pinned() -> None:
    """``supervisor.__all__`` and ``supervisor.batch.__all__`` are public API: a name may not
    disappear or appear without this list changing with it."""
    assert sorted(supervisor.__all__) == [
        "AuthenticationFailed", "Cause", "Client", "Daemon", "DaemonAlreadyRunning", "DaemonShuttingDown",
        "DaemonUnavailable", "FollowerDropped", "InvalidAgent", "JournalUnavailable", "ProtocolError",
        "QueueFull", "RaySupervisor", "Supervisor", "SupervisorClosed", "SyncClient", "SyncSupervisor",
        "SyncTurnHandle", "TurnError", "TurnHandle", "TurnResult", "TurnpoolError", "UnknownTurn",
        "WorkerStartError",
    ]  # fmt: skip
    assert sorted(supervisor.batch.__all__) == [
        "BatchError", "BatchInputError", "BatchPlan", "BatchProgress", "BatchRun", "BatchSummary",
        "DEFAULT_RETRY_ON", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "InvalidLine", "Job",
        "OutputNotEmpty", "ResultLog", "load_jobs", "open_backend", "prepare_batch", "read_previous",
        "register", "run_batch", "turn_id_for",
    ]  # fmt: skip
    for name in supervisor.__all__ + supervisor.batch.__all__:
        if name == "RaySupervisor" and importlib.util.find_spec("ray") is None:
            continue  # the ray extra is not installed: the name is there, its import needs Ray
        assert hasattr(supervisor, name) or hasattr(supervisor.batch, name), name


def test_import_supervisor_does_not_import_ray() -> None:
    """The core works without Ray installed: ``supervisor.RaySupervisor`` is resolved lazily,
    so a fresh ``import supervisor`` (and the CLI's) leaves ``ray`` out of ``sys.modules``."""
    code = "import sys, supervisor, supervisor.cli.main; assert 'ray' not in sys.modules, 'ray imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def _modules(package: str) -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Modules ``name`` imports at module level (``TYPE_CHECKING`` blocks left out)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(sub, ast.ImportFrom):
                if sub.level:
                    base = package.split(".")[: len(package.split(".")) - (sub.level - 1)]
                    target = ".".join(base + ([sub.module] if sub.module else []))
                else:
                    target = sub.module or ""
                for alias in sub.names:
                    candidate = f"{target}.{alias.name}"
                    out.add(candidate if candidate in known else target)
            elif isinstance(sub, ast.Import):
                out.update(alias.name for alias in sub.names)
    return {m for m in out if m in known and m != name}


def test_the_supervisor_imports_no_private_worker_module() -> None:
    """The supervisor uses the worker side only through ``worker.lowlevel`` (and ``worker``'s
    public names), never ``worker._x``."""
    mods = _modules("supervisor")
    text = {name: path.read_text() for name, path in mods.items()}
    private = re.compile(r"^\s*(from worker\._|import worker\._|from worker import _)", re.M)
    bad = [name for name, src in text.items() if private.search(src)]
    assert bad == []


def test_front_ends_touch_no_private_engine_attribute() -> None:
    """No module outside the engine reads or writes an attribute starting with ``_`` on a
    supervisor or a backend (such as the turn table behind ``sup``): front ends use named methods."""
    pattern = re.compile(r"\b(sup|self\.sup|daemon\.sup|backend|self\._backend)\._[a-z]")
    offenders = []
    for folder in ("supervisor", "tests", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            if "_engine" in path.parts:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


def test_no_import_cycle_between_modules() -> None:
    """No circle of module-level imports in wire/, worker/ or supervisor/ (a package importing its
    own submodules is not a circle)."""
    known = {**_modules("wire"), **_modules("worker"), **_modules("supervisor")}
    graph = {name: _imports(name, path, known) for name, path in known.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(trail[trail.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, trail + [dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []
