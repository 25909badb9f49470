"""Who gets in, through every front end of the daemon (issue 27, section 3).

* A loopback HTTP listener serves only the daemon's own uid, as the ``ipc://`` socket does: a real
  process running as ``nobody`` gets ``403`` for everything, submits nothing (SEC-PEER).
* ``serve --allow-agent PATTERN`` (and TOML ``allow_agents``): a name no pattern matches is refused
  at submit through ``Client``, ``SyncClient``, HTTP (``403``), the CLI (one line, exit 2) and a
  running turn's ``spawn``, and is never imported (an agent module whose import writes a file
  proves it) (SEC-ALLOW).
* A front end another uid can reach (``tcp://``, abstract ``ipc://@``, HTTP off loopback) needs a
  credential and an allowlist, or ``serve`` refuses to start with one line (SEC-SHARED).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from supervisor import Client, InvalidAgent, Supervisor, SyncClient, lowlevel
from supervisor.lowlevel import AgentAllowlist, diag_uid, proc_uid, socket_peer_uid
from tests.support import daemonkit
from tests.support.daemonkit import FAST, HTTP, ROOT, serving

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # readable and runnable by any user (the venv may not be)
AS_ROOT = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
    reason="needs root (to run a client as another uid, nobody) and a system python",
)

# What a client of another uid tries: list turns, submit one, load the dashboard.
HTTP_CLIENT = r"""
import http.client, json, sys
host, port = sys.argv[1], int(sys.argv[2])
out = []
body = json.dumps({"agent": "examples.agents:echo", "input": "from another uid"})
for method, path, data in (("GET", "/v1/turns", None), ("POST", "/v1/turns", body), ("GET", "/", None)):
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request(method, path, body=data, headers={"content-type": "application/json"})
        reply = conn.getresponse()
        out.append([reply.status, reply.read().decode(errors="replace")])
    except OSError as exc:
        out.append([None, repr(exc)])
    finally:
        conn.close()
print(json.dumps(out))
"""


def _http_as(uid: int | None, url: str) -> list[list[Any]]:
    host_port = url.removeprefix("http://").rstrip("/")
    host, _, port = host_port.rpartition(":")
    user = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    proc = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-c", HTTP_CLIENT, host, port],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        check=True,
        **user,  # type: ignore[arg-type]
    )
    return list(json.loads(proc.stdout))


@AS_ROOT
def test_another_uid_is_refused_on_the_loopback_http_listener() -> None:
    """SEC-PEER: ``nobody`` gets 403 (JSON, naming the rule) for the API, a submit and the dashboard;
    no turn is submitted. The daemon's own uid, on the same listener, gets 200/201."""
    with serving(*FAST, "--no-journal", *HTTP) as d:
        foreign = _http_as(NOBODY, d.http_url)
        assert [status for status, _ in foreign] == [403, 403, 403], foreign
        for _, body in foreign:
            error = json.loads(body)["error"]
            assert error["code"] == "forbidden" and "only the daemon's user" in error["message"], error
        listed = httpx.get(d.http_url + "v1/turns", timeout=30)
        assert listed.status_code == 200 and listed.json()["turns"] == []  # nothing was submitted
        own = _http_as(None, d.http_url)
        assert [status for status, _ in own] == [200, 201, 200], own
        status = httpx.get(d.http_url + "v1/status", timeout=30).json()
        assert status["http"]["refused"] >= 3  # counted where an operator sees it


def test_the_peer_of_a_loopback_connection_is_found_by_uid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel names the uid owning a connection's client end, through ``sock_diag`` and through
    ``/proc/net/tcp{,6}`` alike, over IPv4 and IPv6; a TIME_WAIT row (owned by nobody: uid 0, inode
    0), a client that is gone or a missing table never match (fail closed)."""
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        server = socket.create_server((host, 0), family=family)
        try:
            client = socket.create_connection(server.getsockname()[:2])
            accepted, _ = server.accept()
            try:
                ends = accepted.getpeername(), accepted.getsockname()
                assert socket_peer_uid(accepted) == os.geteuid()
                assert diag_uid(*ends) == proc_uid(*ends) == os.geteuid()
                with monkeypatch.context() as patch:  # netlink refused (a sandbox): /proc answers
                    patch.setattr(lowlevel.peers, "diag_uid", _refused_netlink)
                    assert lowlevel.connection_uid(*ends) == os.geteuid()
                client.close()  # orphaned now: no inode, no owner
                assert diag_uid(*ends) is None and proc_uid(*ends) is None
            finally:
                accepted.close()
                client.close()
        finally:
            server.close()
    fake = tmp_path / "net"
    fake.mkdir()
    header = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    )
    row = "   0: 0100007F:1F90 0100007F:0050 {st} 00000000:00000000 00:00000000 00000000  {uid}  0 {ino} 1\n"
    (fake / "tcp").write_text(
        header + row.format(st="06", uid=0, ino=0) + row.format(st="01", uid=1234, ino=99)
    )
    peer, local = ("127.0.0.1", 0x1F90), ("127.0.0.1", 0x50)
    assert proc_uid(peer, local, root=str(fake)) == 1234
    (fake / "tcp").write_text(header + row.format(st="06", uid=0, ino=0))
    assert proc_uid(peer, local, root=str(fake)) is None
    assert proc_uid(peer, local, root=str(tmp_path / "none")) is None


def _refused_netlink(*args: Any) -> None:
    raise PermissionError(1, "netlink refused")


def test_a_loopback_listener_is_refused_at_start_where_no_owner_can_be_known(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SEC-PEER at start: where the system cannot say who owns a loopback connection, a loopback
    listener would refuse everyone: ``--http`` is refused at once with one line instead."""
    from supervisor.daemon import Daemon
    from supervisor.http import attach_http

    home = daemonkit.short_dir()
    try:
        daemon = Daemon(f"ipc://{home}/s.sock", supervisor={"workers": 1, "spares": 0})
        attach_http(daemon, "127.0.0.1:0")  # here the owner is known: accepted
        monkeypatch.setattr(lowlevel.peers, "socket_peer_uid", lambda sock: None)
        with pytest.raises(ValueError, match="does not say which user owns a loopback connection"):
            attach_http(daemon, "127.0.0.1:0")
    finally:
        shutil.rmtree(home, ignore_errors=True)


# An agent module whose import leaves a trace: if anything imported it, the file exists.
TRACED_AGENT = """
import os
with open({marker!r}, "a") as f:
    f.write(str(os.getpid()) + "\\n")


async def run(turn):
    return "ran"
"""


def _traced_agents(home: Path) -> tuple[Path, Path, Path]:
    """A directory with ``access_refused`` and ``access_allowed`` modules; their marker files."""
    agents = home / "agents"
    agents.mkdir()
    refused, allowed = home / "refused.imported", home / "allowed.imported"
    (agents / "access_refused.py").write_text(TRACED_AGENT.format(marker=str(refused)))
    (agents / "access_allowed.py").write_text(TRACED_AGENT.format(marker=str(allowed)))
    return agents, refused, allowed


def test_allow_agent_refuses_other_agents_through_every_front_end_and_never_imports_them() -> None:
    """SEC-ALLOW: with ``--allow-agent`` a non-matching agent is refused by ``Client`` and
    ``SyncClient`` (``InvalidAgent`` naming the patterns), HTTP (403 ``agent_not_allowed``), the CLI
    (one line, exit 2), ``turnpool batch --connect`` and a running turn's ``spawn``; its module is
    never imported. An allowed module with the same import side effect is imported and runs."""
    home = daemonkit.short_dir()
    agents, refused, allowed = _traced_agents(home)
    flags = ("--allow-agent", "examples.agents:*", "--allow-agent", "access_allowed:*")
    with serving(*FAST, "--no-journal", *flags, *HTTP, home=home, paths=(ROOT, str(agents))) as d:

        async def through_client() -> None:
            async with Client.connect(d.endpoint) as client:
                with pytest.raises(
                    InvalidAgent, match=r"'access_refused:run' is not allowed.*examples\.agents:\*"
                ):
                    await client.submit("access_refused:run")
                with anyio.fail_after(60):
                    spawned = await client.run("examples.agents:parent", {"child": "access_refused:run"})
                assert spawned.outcome == "failed" and spawned.error is not None
                assert spawned.error.type == "SpawnError" and "not allowed" in spawned.error.message
                with anyio.fail_after(60):
                    assert (await client.run("access_allowed:run")).output == "ran"

        anyio.run(through_client)
        with SyncClient.connect(d.endpoint) as sync, pytest.raises(InvalidAgent, match="not allowed"):
            sync.run("access_refused:run")
        r = httpx.post(d.http_url + "v1/turns", json={"agent": "access_refused:run", "input": 1}, timeout=30)
        assert r.status_code == 403 and r.json()["error"]["code"] == "agent_not_allowed", r.text
        assert "not allowed" in r.json()["error"]["message"]
        cli = d.cli("submit", "access_refused:run")
        assert cli.returncode == 2 and cli.stdout == "", cli
        assert len(cli.stderr.strip().splitlines()) == 1 and "not allowed" in cli.stderr, cli.stderr
        jobs, out = home / "jobs.jsonl", home / "out.jsonl"
        jobs.write_text('{"id": "a", "input": 1}\n')
        batch = d.cli(
            "batch", str(jobs), "--agent", "access_refused:run", "-o", str(out), "--connect", d.endpoint
        )
        # ADAPT-PROBE: batch records a job whose agent is refused at submit as a final failed line.
        line = json.loads(out.read_text().splitlines()[0]) if out.exists() else {}
        refusal = f"{batch.stderr} {line.get('error') or ''}"
        assert batch.returncode != 0 and "not allowed" in refusal, (batch, line)
        assert "Traceback" not in batch.stderr, batch.stderr
        status = d.cli("status", "--json")
        assert json.loads(status.stdout)["outcomes"]["completed"] == 1  # only the allowed one ran
        # (checked while the daemon's home, which holds the traces, still exists)
        assert allowed.exists()  # the trace works: the allowed module was imported
        assert not refused.exists(), refused.read_text()  # never imported, by any process


def test_allow_agents_in_the_toml_config() -> None:
    """SEC-ALLOW: ``allow_agents = [...]`` in ``--config`` restricts as the flag does; a value that is
    not a list of patterns is one line and exit 2 before anything starts."""
    home = daemonkit.short_dir()
    config = home / "serve.toml"
    config.write_text('allow_agents = ["examples.agents:echo"]\n')
    with serving(*FAST, "--no-journal", "--config", str(config), home=home) as d:

        async def check() -> None:
            async with Client.connect(d.endpoint) as client:
                with anyio.fail_after(60):
                    assert (await client.run("examples.agents:echo", 7)).output == 7
                with pytest.raises(InvalidAgent, match=re.escape("'examples.agents:slow' is not allowed")):
                    await client.submit("examples.agents:slow")

        anyio.run(check)
        bad = home / "bad.toml"
        bad.write_text('allow_agents = "examples.*"\n')
        refused = d.cli(
            "serve", "--config", str(bad), "--endpoint", f"ipc://{home}/other.sock", "--no-journal"
        )
        assert refused.returncode == 2, refused
        assert refused.stderr.strip().splitlines() == [refused.stderr.strip()]
        assert "allow_agents must be a list" in refused.stderr


def _serve_refused(home: Path, *args: str) -> str:
    proc = subprocess.run(
        daemonkit.turnpool_argv("serve", "--no-journal", *args),
        env=daemonkit.env_for(home, None),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_a_front_end_other_users_can_reach_needs_a_credential_and_an_allowlist() -> None:
    """SEC-SHARED: ``tcp://`` (even with ``--insecure-tcp``), abstract ``ipc://@`` and HTTP off
    loopback (even with a token) are refused at start without ``--allow-agent``, in one line."""
    home = daemonkit.short_dir()
    try:
        token = home / "token"
        token.write_text("a-token-long-enough-for-this-test")
        token.chmod(0o600)
        why = _serve_refused(home, "--endpoint", "tcp://127.0.0.1:0", "--insecure-tcp")
        assert "without an agent allowlist" in why and "--allow-agent" in why
        name = f"ipc://@turnpool-access-{os.getpid()}"
        assert "without CURVE" in _serve_refused(home, "--endpoint", name, "--allow-agent", "x:*")
        assert "without an agent allowlist" in _serve_refused(home, "--endpoint", name, "--insecure-tcp")
        why = _serve_refused(
            home, "--endpoint", f"ipc://{home}/s.sock", "--http", "0.0.0.0:0", "--http-token", str(token)
        )
        assert "--allow-agent" in why
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.anyio
async def test_the_embedded_supervisor_refuses_agents_outside_allow_agents() -> None:
    """SEC-ALLOW in the engine: ``Supervisor(allow_agents=...)`` refuses other agents at the call
    (``AgentNotAllowed``, an ``InvalidAgent``); bad pattern lists are refused at construction."""
    sup = Supervisor(workers=1, spares=0, allow_agents=["examples.agents:e*"])
    with pytest.raises(InvalidAgent, match="not allowed") as refused:
        await sup.submit("examples.agents:slow")
    assert type(refused.value).__name__ == "AgentNotAllowed"
    with pytest.raises(TypeError, match="list of patterns"):
        Supervisor(allow_agents="examples.*")
    with pytest.raises(ValueError, match="empty"):
        Supervisor(allow_agents=[])
    with pytest.raises(ValueError, match="printable"):
        Supervisor(allow_agents=["a b"])
    allow = AgentAllowlist(["myapp.agents:*", "other.mod:run"])
    assert allow.allows("myapp.agents:x") and allow.allows("other.mod:run")
    assert not allow.allows("myapp.agentsx:y") and not allow.allows("other.mod:run2")
    assert not allow.allows("evil:x")


@pytest.mark.anyio
async def test_a_restart_with_a_narrower_allowlist_never_runs_a_queued_turn_it_refuses() -> None:
    """SEC-ALLOW at recovery: a turn acknowledged and still queued when the daemon died, whose agent
    the restarted daemon's ``--allow-agent`` no longer matches, ends ``failed`` (``AgentNotAllowed``)
    and is never imported; an allowed queued turn beside it runs."""
    home = daemonkit.short_dir()
    agents, refused, allowed = _traced_agents(home)
    journal = home / "journal.sqlite3"
    paths = (ROOT, str(agents))
    served = daemonkit.start(*FAST, "--workers", "1", "--journal", str(journal), home=home, paths=paths)
    try:
        async with Client.connect(served.endpoint) as client:
            await client.submit("examples.agents:slow", {"seconds": 600})
            with anyio.fail_after(30):
                while (await client.status())["running"] < 1:  # noqa: ASYNC110 — a request per loop
                    await anyio.sleep(0.02)  # allowed: polling status until the blocker runs, bounded
            kept = (await client.submit("access_refused:run")).turn_id
            other = (await client.submit("access_allowed:run")).turn_id
    finally:
        served.proc.kill()  # the queued turns stay queued in the journal
        served.proc.wait(timeout=60)
        daemonkit.stop_process(served.proc)
    # The first daemon, with no allowlist, probed the name at submit (ADAPT-PROBE imports it in a probe
    # child): what this test holds is that the restarted daemon, which refuses it, never imports it.
    refused.unlink(missing_ok=True)
    flags = ("--allow-agent", "examples.agents:*", "--allow-agent", "access_allowed:*")
    again = daemonkit.start(*FAST, *flags, "--journal", str(journal), home=home, paths=paths)
    try:
        async with Client.connect(again.endpoint) as client:
            with anyio.fail_after(60):
                result = await client.handle(kept).result()
                assert (await client.handle(other).result()).output == "ran"
        assert result.outcome == "failed" and result.error is not None, result
        assert result.error.type == "AgentNotAllowed" and "no longer allowed" in result.error.message
        assert allowed.exists() and not refused.exists()
    finally:
        daemonkit.stop_process(again.proc)
        shutil.rmtree(home, ignore_errors=True)
