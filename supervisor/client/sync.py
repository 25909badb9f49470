"""``SyncClient``: ``Client`` with blocking methods, run on its own asyncio loop in a portal thread
(``SyncFront``), so it works from any synchronous code."""

from __future__ import annotations

from typing import Any

from .._sync import SyncFront
from .client import Client


class SyncClient(SyncFront):
    """``Client`` with blocking methods::

        with SyncClient.connect(ep) as client:
            print(client.run("examples.agents:echo", {"text": "hi"}).output)

    or without ``with``: the first call connects, ``close()`` disconnects (one never closed is
    closed at interpreter exit and never keeps it alive).
    """

    def __init__(self, endpoint: str | None = None, **kwargs: Any) -> None:
        super().__init__()
        Client(endpoint, **kwargs)  # validate the arguments now, at the call
        self._endpoint = endpoint
        self._kwargs = kwargs

    @classmethod
    def connect(cls, endpoint: str | None = None, **kwargs: Any) -> SyncClient:
        """A blocking client for ``endpoint`` (``with SyncClient.connect(ep) as client``, or
        without ``with``: it connects on first use)."""
        return cls(endpoint, **kwargs)

    def _make(self) -> Any:
        return Client.connect(self._endpoint, **self._kwargs)

    def __enter__(self) -> SyncClient:
        self._open()
        return self

    def exists(self, turn_id: str) -> bool:
        return bool(self._call("exists", turn_id))

    def reload(self) -> dict[str, int]:
        """``Client.reload``, blocking: recycle the daemon's workers so new turns import agent code anew."""
        result: dict[str, int] = self._call("reload")
        return result
