"""docs/reference.md against the code: every ``Supervisor(...)`` parameter with its default, every option of
every command, every config key, every metric with its type and labels, every exit code and every
environment variable the packages read are in the reference, so the page cannot fall behind the code.

Pure reading: no process is started."""

from __future__ import annotations

import argparse
import ast
import inspect
import re
from pathlib import Path

import supervisor.daemon.metrics
from supervisor import Client, RaySupervisor, Supervisor
from supervisor.cli.main import build_parser

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = (ROOT / "docs" / "reference.md").read_text()


def _section(title: str) -> str:
    """The text under ``## title`` up to the next ``## `` heading."""
    head = f"\n## {title}\n"
    assert head in REFERENCE, f"docs/reference.md has no section {title!r}"
    return REFERENCE.split(head, 1)[1].split("\n## ", 1)[0]


def _rows(text: str) -> dict[str, list[str]]:
    """Table rows keyed by their first cell's first backticked name: ``| `x` | a | b |`` → {x: [a, b]}."""
    rows = {}
    for line in text.splitlines():
        match = re.match(r"^\| `([^`]+)`[^|]*\|(.*)\|$", line)
        if match:
            rows[match.group(1)] = [cell.strip() for cell in match.group(2).split("|")]
    return rows


def _named(text: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", text))


def _parameters(function: object) -> dict[str, inspect.Parameter]:
    return {
        name: p
        for name, p in inspect.signature(function).parameters.items()  # type: ignore[arg-type]
        if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def test_every_supervisor_parameter_is_in_the_reference_with_its_default() -> None:
    rows = _rows(_section("Supervisor options"))
    parameters = _parameters(Supervisor.__init__)
    assert len(parameters) >= 29
    missing = sorted(set(parameters) - set(rows))
    assert missing == [], f"Supervisor parameters missing from docs/reference.md: {missing}"
    extra = sorted(set(rows) - set(parameters))
    assert extra == [], f"docs/reference.md lists parameters Supervisor does not take: {extra}"
    wrong = []
    for name, parameter in parameters.items():
        written = re.fullmatch(r"`([^`]*)`", rows[name][0])
        assert written, f"{name}: the default cell is not one `value`: {rows[name][0]!r}"
        if ast.literal_eval(written.group(1)) != parameter.default:
            wrong.append(f"{name}: doc {written.group(1)}, code {parameter.default!r}")
    assert wrong == []


def test_every_client_and_ray_option_is_in_the_reference() -> None:
    for title, function in (
        ("Client options", Client.connect),
        ("RaySupervisor options", RaySupervisor.__init__),
        ("Per-turn options", Supervisor.submit),
    ):
        named = _named(_section(title))
        missing = sorted(set(_parameters(function)) - named - {"agent", "input"})
        assert missing == [], f"{title}: missing {missing}"


def _commands() -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1
    return dict(actions[0].choices)


def _shown(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a for a in parser._actions if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)
    ]


def test_every_option_of_every_command_is_in_the_reference() -> None:
    text = _section("Command-line options")
    commands = _commands()
    assert "serve" in commands
    missing = []
    for name, parser in commands.items():
        head = f"\n### `turnpool {name}`\n"
        assert head in text, f"docs/reference.md has no table for `turnpool {name}`"
        table = text.split(head, 1)[1].split("\n### ", 1)[0]
        options = {written.split(" ")[0] for written in _named(table)}
        missing += [
            f"turnpool {name} {flag}"
            for a in _shown(parser)
            for flag in a.option_strings
            if flag not in options
        ]
    assert missing == []


def test_every_config_key_is_in_the_reference() -> None:
    serve = _commands()["serve"]
    flags_only = {"config", "ray", "workers_per_node"}
    keys = {a.dest for a in _shown(serve) if a.option_strings} - flags_only
    missing = sorted(keys - _named(_section("Config file keys")))
    assert missing == []


def _registered_metrics() -> dict[str, tuple[str, list[str]]]:
    """Every metric ``supervisor.daemon.metrics`` makes: its exposed name → (type, labels)."""
    tree = ast.parse(inspect.getsource(supervisor.daemon.metrics))
    found = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        maker = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        kind = {"CounterMetricFamily": "counter", "GaugeMetricFamily": "gauge", "Histogram": "histogram"}.get(
            maker
        )
        if kind is None:
            continue
        assert isinstance(node.args[0], ast.Constant), ast.dump(node)
        name = str(node.args[0].value) + ("_total" if kind == "counter" else "")
        labels: list[str] = []
        lists = [a for a in node.args[2:] if isinstance(a, ast.List)]
        lists += [
            k.value
            for k in node.keywords
            if k.arg in ("labels", "labelnames") and isinstance(k.value, ast.List)
        ]
        for listed in lists:
            labels += [str(e.value) for e in listed.elts if isinstance(e, ast.Constant)]
        found[name] = (kind, labels)
    return found


def test_every_metric_is_in_the_reference_with_its_type_and_labels() -> None:
    rows = _rows(_section("Prometheus metrics"))
    metrics = _registered_metrics()
    assert len(metrics) > 20
    assert sorted(set(metrics) ^ set(rows)) == []
    wrong = []
    for name, (kind, labels) in metrics.items():
        written_kind, written_labels = rows[name][0], rows[name][1]
        listed = set(re.findall(r"`([a-z_]+)`", re.sub(r"\([^)]*\)", "", written_labels)))
        if written_kind != kind or listed != set(labels):
            wrong.append(f"{name}: doc {written_kind} {sorted(listed)}, code {kind} {sorted(labels)}")
    assert wrong == []


def _exit_codes() -> set[int]:
    """The ``EXIT_*`` constants, read from ``supervisor/_exitcodes.py`` (tests import no private module)."""
    tree = ast.parse((ROOT / "supervisor" / "_exitcodes.py").read_text())
    return {
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id.startswith("EXIT_") for t in node.targets)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, int)
    }


def test_every_exit_code_is_in_the_reference() -> None:
    codes = _exit_codes()
    assert 0 in codes and 130 in codes
    rows = {int(m) for m in re.findall(r"^\| (\d+) \|", _section("Exit codes"), re.M)}
    assert codes <= rows, codes - rows


def test_every_environment_variable_the_packages_read_is_in_the_reference() -> None:
    sources = "\n".join(
        path.read_text()
        for package in ("wire", "worker", "supervisor")
        for path in (ROOT / package).rglob("*.py")
    )
    read = set(re.findall(r"environ\.get\(\s*\"([A-Z_]+)\"", sources))
    read |= set(re.findall(r"environ\[\s*\"([A-Z_]+)\"\s*\]", sources))
    read |= set(re.findall(r"getenv\(\s*\"([A-Z_]+)\"", sources))
    read |= set(re.findall(r"\"(TURNPOOL_[A-Z_]+)\"", sources))
    assert "TURNPOOL_ENDPOINT" in read
    missing = sorted(read - _named(_section("Environment variables")))
    assert missing == []
