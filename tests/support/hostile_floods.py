"""The attacks of the hostile-neighbour soak that come from outside the daemon
(``tests/support/hostile_soak.py``): connection floods on its HTTP and CURVE ``tcp://`` front ends,
and a second ``turnpool serve`` on its journal. Each is bounded in count, bytes and time, loopback
only, and counts what it met (``stats``) instead of raising.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
from pathlib import Path

from supervisor.daemon.server import READY_PREFIX
from tests.support import daemonkit

# -- floods (threads with blocking sockets; each bounded, each stops when ``stop`` is set) ----------


def connect(host: str, port: int) -> socket.socket | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect((host, port))
    except OSError:
        s.close()
        return None
    return s


def half_open_http(
    host: str, port: int, n: int, stop: threading.Event, stats: dict[str, int], delay: float = 0.0
) -> None:
    """After ``delay`` seconds, ``n`` connections that send a request line and one header, then
    nothing."""
    held = []
    try:
        if stop.wait(delay):
            return
        for _ in range(n):
            if stop.is_set():
                break
            s = connect(host, port)
            if s is None:
                stats["refused"] += 1
                continue
            try:
                s.sendall(b"GET /v1/turns HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                held.append(s)
                stats["opened"] += 1
            except OSError:
                stats["refused"] += 1
                s.close()
        stop.wait()
        for s in held:  # which ones the daemon closed meanwhile (timed out before authentication)
            s.setblocking(False)
            try:
                stats["closed_by_daemon"] += s.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                stats["closed_by_daemon"] += 1
    finally:
        for s in held:
            s.close()


def endless_header(host: str, port: int, mib: int, stop: threading.Event, stats: dict[str, int]) -> None:
    """One connection streaming a header that never ends, up to ``mib`` MiB."""
    s = connect(host, port)
    if s is None:
        stats["refused"] += 1
        return
    try:
        s.sendall(b"GET /v1/turns HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Endless: ")
        chunk = b"a" * 65536
        sent = 0
        while sent < mib * 2**20 and not stop.is_set():
            try:
                s.sendall(chunk)
            except TimeoutError:
                stats["stalled"] += 1  # the daemon stopped reading: as good as a bound
                break
            except OSError:
                stats["cut_by_daemon"] += 1
                break
            sent += len(chunk)
        stats["bytes_sent"] += sent
        stop.wait()
    finally:
        s.close()


def raw_tcp(host: str, port: int, n: int, stop: threading.Event, stats: dict[str, int]) -> None:
    """``n`` connections to the CURVE endpoint that send a few bytes and never handshake."""
    held = []
    try:
        for i in range(n):
            if stop.is_set():
                break
            s = connect(host, port)
            if s is None:
                stats["refused"] += 1
                continue
            held.append(s)
            stats["opened"] += 1
            if i % 2:
                with contextlib.suppress(OSError):
                    s.sendall(b"\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f")  # a ZMTP greeting start
        stop.wait()
    finally:
        for s in held:
            s.close()


# -- a second daemon on the same journal ------------------------------------------------------------


def _try_second(journal: Path, wrap: tuple[str, ...], label: str, pids: list[int]) -> str:
    """Start ``turnpool serve`` on ``journal`` (through ``wrap``); returns what happened. A second
    daemon that starts is stopped at once (SIGTERM)."""
    home = daemonkit.short_dir()
    try:
        served = daemonkit.start(
            "--journal",
            str(journal),
            *daemonkit.FAST,
            "--workers",
            "1",
            home=home,
            wrap=wrap,
            check_ready=False,
        )
        pids.append(served.pid)
        line = daemonkit._read_line(served.proc, 30.0)
        if line.startswith(READY_PREFIX):
            daemonkit.stop_process(served.proc)
            return f"started (NOT refused) {label}"
        try:
            code = served.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemonkit.stop_process(served.proc)
            return f"no ready line and no exit within 30 s {label}"
        if served.proc.stdout is not None:
            served.proc.stdout.close()
        err = (home / "stderr.log").read_text(errors="replace").strip().splitlines()
        why = err[-1][:160] if err else line[:160]
        return f"refused (exit {code}): {why}"
    finally:
        shutil.rmtree(home, ignore_errors=True)


def second_daemons(journal: Path, pids: list[int]) -> dict[str, str]:
    """Both attempts at once: from another network namespace (root only, else skipped with the
    reason) and through a hard link to the journal."""
    from concurrent.futures import ThreadPoolExecutor

    seen: dict[str, str] = {}
    link = journal.with_name("hardlink-" + journal.name)
    with ThreadPoolExecutor(2) as pool:
        attempts = {}
        if os.geteuid() != 0:
            seen["other network namespace"] = "skipped: unshare --net needs root here"
        elif shutil.which("unshare") is None:
            seen["other network namespace"] = "skipped: no unshare(1)"
        else:
            probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True)
            if probe.returncode != 0:
                seen["other network namespace"] = (
                    f"skipped: unshare --net failed: {probe.stderr.strip()[:100]}"
                )
            else:
                netns = ("unshare", "--net", "--")
                attempts["other network namespace"] = pool.submit(
                    _try_second, journal, netns, "in a netns", pids
                )
        try:
            os.link(journal, link)
        except OSError as exc:
            seen["hard link to the journal"] = f"skipped: cannot link: {exc}"
        else:
            attempts["hard link to the journal"] = pool.submit(
                _try_second, link, (), "through a hard link", pids
            )
        try:
            for what, attempt in attempts.items():
                seen[what] = attempt.result()
        finally:
            link.unlink(missing_ok=True)
    return seen


def http_probe(host: str, port: int, token: str, stop: threading.Event, stats: dict[str, int]) -> None:
    """An ordinary HTTP client beside the floods: about once a second, an authenticated
    ``GET /v1/turns/warm`` on a fresh connection; counts the answers (``ok``), what got no answer
    within 5 s (``failed``) and the slowest answer (``slowest_ms``)."""
    import time

    request = (
        f"GET /v1/turns/warm HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    while not stop.is_set():
        t0 = time.monotonic()
        s = connect(host, port)
        try:
            if s is None:
                stats["failed"] += 1
            else:
                s.sendall(request)
                line = s.recv(64)
                if line.startswith(b"HTTP/1.1 200"):
                    stats["ok"] += 1
                    stats["slowest_ms"] = max(stats["slowest_ms"], int((time.monotonic() - t0) * 1000))
                else:
                    stats["failed"] += 1
        except OSError:
            stats["failed"] += 1
        finally:
            if s is not None:
                s.close()
        stop.wait(1.0)  # the probe's pace, not a synchronisation
