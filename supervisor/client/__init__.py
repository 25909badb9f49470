"""The daemon's client: ``Client`` (async, ``client.py``) and ``SyncClient`` (blocking, ``sync.py``),
the same ``Backend`` contract as an embedded ``Supervisor``, over the client protocol;
``replies.py`` holds the request plumbing they share."""

from .client import Client
from .sync import SyncClient

__all__ = ["Client", "SyncClient"]
