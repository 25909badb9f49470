"""Real small disks for tests: a private tmpfs of a given size, mounted here (root) and unmounted in
teardown, and filling one to its last byte."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemonkit import short_dir


def run_quiet(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


@contextlib.contextmanager
def tmpfs(size: str) -> Iterator[Path]:
    """A private tmpfs of ``size`` (mode 0700), unmounted afterwards."""
    where = short_dir()
    try:
        run_quiet("mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where))
    except (OSError, subprocess.CalledProcessError) as exc:
        shutil.rmtree(where, ignore_errors=True)
        pytest.skip(f"this machine cannot mount a tmpfs here: {exc}")
    try:
        yield where
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(where)], capture_output=True, timeout=60)
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=60)
        shutil.rmtree(where, ignore_errors=True)


def fill(where: Path) -> Path:
    """Fill the filesystem at ``where`` to the last byte; returns the filler file."""
    filler = where / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (65536, 512):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler
