"""``serve --http-token FILE`` given something that is not a small regular file: one line and exit 2
at start, never a daemon blocked reading it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import daemonkit
from tests.support.daemonkit import FAST

START_BOUND = 60.0  # seconds for ``serve`` to refuse: an interpreter start, loaded machine included


def _refused(home: Path, token: Path) -> subprocess.CompletedProcess[str]:
    """``turnpool serve --http 0 --http-token TOKEN``, bounded: a serve blocked on the file fails the test."""
    env = daemonkit.env_for(home, f"ipc://{home}/s.sock")
    try:
        return subprocess.run(
            daemonkit.turnpool_argv("serve", *FAST, "--http", "127.0.0.1:0", "--http-token", str(token)),
            env=env,
            capture_output=True,
            text=True,
            timeout=START_BOUND,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"serve --http-token {token} still starting after {START_BOUND} s (blocked reading it)")


@pytest.mark.parametrize("kind", ["fifo", "directory", "device", "huge"])
def test_a_token_path_that_is_not_a_small_regular_file_is_refused_at_start(kind: str) -> None:
    """A FIFO (which blocked ``serve`` for ever), a directory, a character device and a 64 MiB file as
    ``--http-token``: each is refused at once with one line naming what it is, exit code 2."""
    home = daemonkit.short_dir()
    try:
        token = home / "token"
        if kind == "fifo":
            os.mkfifo(token, 0o600)
        elif kind == "directory":
            token.mkdir(mode=0o700)
        elif kind == "device":
            token = Path("/dev/zero")
        else:
            with open(token, "wb") as f:
                f.write(b"a" * 32)
                f.truncate(64 << 20)  # sparse: no disk spent
            token.chmod(0o600)
        done = _refused(home, token)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2, done.stderr
        assert len(lines) == 1, done.stderr
        expected = {
            "fifo": "is a FIFO",
            "directory": "is a directory",
            "device": "is a device",
            "huge": "more than a token",
        }[kind]
        assert f"--http-token {token}" in lines[0] and expected in lines[0], lines[0]
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_a_regular_token_file_is_still_read(tmp_path: Path) -> None:
    """The checks refuse only what is not a token: a 0600 regular file's token is read as before."""
    from supervisor.http import read_token

    path = tmp_path / "token"
    path.write_text("abcdefghijklmnopqrstuvwxyz\n")
    path.chmod(0o600)
    assert read_token(path) == "abcdefghijklmnopqrstuvwxyz"
