"""The daemon's client: ``Client`` (async) and ``SyncClient``, the same ``Backend`` contract as an
embedded ``Supervisor``, over the client protocol."""

from .client import Client, SyncClient

__all__ = ["Client", "SyncClient"]
