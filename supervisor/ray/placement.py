"""Where a turn goes on the cluster: pure functions, no Ray, so they are cheap to test.

* A turn id the router makes names its node: ``<node key>.<random>`` (``node_of``), so any
  router (or a restarted one) finds the owning node from the id alone.
* A caller-given ``turn_id`` has no node in it: it goes where rendezvous hashing of the id
  over the live nodes says, so the same id submitted twice lands on the same node, whose
  supervisor then runs it once (RAY-IDS).
* A session goes where rendezvous hashing of its name says (RAY-SESSIONS). Rendezvous
  (highest random weight) hashing moves only the sessions the new node wins when a node joins,
  and only the lost node's sessions when one leaves; the router keeps a session on its node
  while the session has turns in flight, so a join never splits a session across two nodes.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterable

KEY_LEN = 12  # hex digits of a Ray node id kept in a node key (48 bits: no clash among live nodes)
SEP = "."


def node_key(node_id: str) -> str:
    """The short name of a Ray node (hex node id) used in turn ids and actor names."""
    return node_id[:KEY_LEN]


def new_turn_id(key: str) -> str:
    """A fresh turn id naming its node."""
    return f"{key}{SEP}{secrets.token_hex(8)}"


_ROUTER_ID = re.compile(r"([0-9a-f]{" + str(KEY_LEN) + r"})\.[0-9a-f]{16}")


def node_of(turn_id: str) -> str | None:
    """The node key a router-made turn id names, or ``None`` (a caller-given id)."""
    match = _ROUTER_ID.fullmatch(turn_id)
    return match.group(1) if match else None


def _weight(key: str, name: str) -> int:
    digest = hashlib.blake2b(f"{key}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous(name: str, keys: Iterable[str]) -> str:
    """The node key that wins ``name`` (a session or a caller's turn id) among ``keys``.

    Raises ``LookupError`` when there is no node to choose from."""
    best: tuple[int, str] | None = None
    for key in keys:
        weight = (_weight(key, name), key)
        if best is None or weight > best:
            best = weight
    if best is None:
        raise LookupError("no live turnpool node on the Ray cluster")
    return best[1]
