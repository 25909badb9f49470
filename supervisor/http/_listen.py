"""Where the HTTP front end listens, and whether it may listen there without a token.

A listener on a loopback address is reachable only from this machine, and serves only the daemon's
own user (``_peer``: each connection's uid is checked); any other address is reachable by other
users and other hosts: it needs a bearer token (``--http-token FILE``) and an agent allowlist
(``--allow-agent``), checked at start so a daemon never comes up open to the network by mistake.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import stat
from pathlib import Path

from ._peer import check_peer_lookup

MIN_TOKEN = 16
# The largest token file read: a token is one line; anything bigger is not one.
MAX_TOKEN_FILE = 4096


def parse_listen(value: str) -> tuple[str, int]:
    """``"PORT"``, ``"HOST:PORT"`` or ``"[V6]:PORT"`` → ``(host, port)``; a bare port means 127.0.0.1.

    Raises ``ValueError`` with the accepted forms."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError("--http must be PORT, HOST:PORT or [IPV6]:PORT")
    text = value.strip()
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
        if not sep:
            raise ValueError(f"--http {value!r}: write an IPv6 address as [ADDR]:PORT")
    elif ":" in text:
        host, _, port_text = text.rpartition(":")
    else:
        host, port_text = "127.0.0.1", text
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"--http {value!r}: the port must be a number, got {port_text!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"--http {value!r}: the port must be 0..65535, got {port}")
    if not host:
        raise ValueError(f"--http {value!r}: the host is empty (write PORT alone for 127.0.0.1)")
    return host, port


def is_loopback(host: str) -> bool:
    """True when every address ``host`` resolves to is a loopback address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def read_token(path: str | os.PathLike[str]) -> str:
    """The bearer token in ``path`` (surrounding whitespace removed).

    Refused with ``ValueError``: anything but a regular file (a FIFO would block the daemon's start
    for ever, a device or a directory has no token), a file over ``MAX_TOKEN_FILE`` bytes, a file
    others may read (like an ssh key), an empty token, or one shorter than 16 characters (a token
    that short is guessable). The file is opened without blocking and checked on its open
    descriptor, so a file swapped for a FIFO after the first look is refused too."""
    file = Path(path)
    _regular(file, file.stat().st_mode)  # OSError when missing: the caller reports it
    fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        _regular(file, st.st_mode)
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise ValueError(
                f"--http-token {file}: the file is readable by others (mode {stat.S_IMODE(st.st_mode):o}); "
                "chmod 600 it"
            )
        if st.st_size > MAX_TOKEN_FILE:
            raise ValueError(
                f"--http-token {file}: the file holds {st.st_size} bytes, more than a token "
                f"({MAX_TOKEN_FILE} bytes at most)"
            )
        data = os.read(fd, MAX_TOKEN_FILE + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_TOKEN_FILE:  # it grew since fstat
        raise ValueError(
            f"--http-token {file}: the file holds more than a token ({MAX_TOKEN_FILE} bytes at most)"
        )
    try:
        token = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError(f"--http-token {file}: the token is not UTF-8 text") from None
    if len(token) < MIN_TOKEN:
        raise ValueError(f"--http-token {file}: the token must be at least {MIN_TOKEN} characters")
    if any(ch.isspace() or not ch.isprintable() for ch in token):
        raise ValueError(f"--http-token {file}: the token must be one line of printable characters")
    return token


def _regular(file: Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(mode)
            else "a directory"
            if stat.S_ISDIR(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "not a regular file"
        )
        raise ValueError(f"--http-token {file}: the path is {kind}; give a regular file holding the token")


def check_access(host: str, port: int, loopback: bool, allow_agents: object) -> None:
    """A loopback listener can tell its clients' uid (SEC-PEER, probed now); a listener others can
    reach (off loopback) needs an agent allowlist besides its token (SEC-SHARED)."""
    if loopback:
        check_peer_lookup(f"{host}:{port}")
    elif allow_agents is None:
        raise ValueError(
            f"--http {host}:{port} is reachable by other users and hosts: it needs --allow-agent PATTERN "
            "(e.g. 'myapp.agents:*') besides --http-token"
        )
