"""The backend contract: what every front end may ask of whatever runs turns.

``Backend`` is the one small protocol that the embedded ``Supervisor`` and the daemon's ``Client``
both implement (and ``RaySupervisor``, on a Ray cluster): public methods only. ``TurnHandle``, the
batch runner and the ACP front end are written against it, so each runs the same on an embedded
pool, through a daemon or on a cluster. ``open_backend`` picks one, written once for every front end.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from wire import Cause, TurnResult

if TYPE_CHECKING:
    from ._handle import TurnHandle
    from ._stream import TurnStream


@runtime_checkable
class Backend(Protocol):
    """Runs turns: accept, follow, await and cancel them, report status."""

    async def submit(
        self,
        agent: str,
        input: Any = None,
        *,
        session: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the turn's timeout, not this call's
        grace: float | None = None,
        kill_after: float | None = None,
        turn_id: str | None = None,
        retry: bool = False,
    ) -> TurnHandle: ...

    async def run(
        self,
        agent: str,
        input: Any = None,
        *,
        session: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the turn's timeout, not this call's
        grace: float | None = None,
        kill_after: float | None = None,
        turn_id: str | None = None,
        retry: bool = False,
    ) -> TurnResult: ...

    def handle(self, turn_id: str) -> TurnHandle: ...

    def stream(
        self, agent: str, input: Any = None, **options: Any
    ) -> contextlib.AbstractAsyncContextManager[TurnStream]: ...

    async def cancel(self, turn_id: str, cause: Any = None) -> Cause | None: ...

    async def cancel_session(self, session: str, cause: Any = None) -> list[str]: ...

    def events(self, turn_id: str) -> AsyncIterator[Any]: ...

    async def result(self, turn_id: str) -> TurnResult: ...

    async def submit_many(
        self,
        agent: str,
        inputs: Iterable[Any],
        *,
        session: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the turns' timeout, not this call's
        grace: float | None = None,
        kill_after: float | None = None,
        turn_ids: Sequence[str | None] | None = None,
        retry: bool = False,
    ) -> list[TurnHandle]: ...

    async def results(self, turns: Iterable[TurnHandle | str]) -> list[TurnResult]: ...

    async def status(self) -> dict[str, Any]: ...

    async def when_idle(self) -> None: ...


@contextlib.asynccontextmanager
async def open_backend(
    *,
    workers: int | None = None,
    connect: str | None = None,
    grace: float | None = None,
    kill_after: float | None = None,
    agent_path: Any = None,
    spares: int | None = None,
    ray: str | None = None,
    workers_per_node: int | None = None,
) -> AsyncIterator[Backend]:
    """An embedded ``Supervisor`` (``workers``, default: one per core; ``spares``, ``agent_path``,
    ``grace`` and ``kill_after`` as for ``Supervisor``, its defaults when ``None``) or, with
    ``connect``, a ``Client`` of the daemon at that endpoint (``""``: the default endpoint), or,
    with ``ray`` (``"auto"`` or a cluster address), a ``RaySupervisor`` over that Ray cluster
    (``workers_per_node``, default: each node's CPU count)."""
    if ray is not None:
        async with _open_ray(
            ray,
            workers_per_node=workers_per_node,
            grace=grace,
            kill_after=kill_after,
            agent_path=agent_path,
            spares=spares,
        ) as cluster:
            yield cluster
        return
    if connect is not None:
        from ._paths import default_endpoint
        from .client.client import Client

        async with Client.connect(connect or default_endpoint()) as client:
            yield client
        return
    from ._engine.supervisor import Supervisor

    given = {"grace": grace, "kill_after": kill_after, "spares": spares}
    kwargs: dict[str, Any] = {"agent_path": agent_path, **{k: v for k, v in given.items() if v is not None}}
    async with Supervisor(workers=workers or os.cpu_count() or 2, **kwargs) as sup:
        yield sup


@contextlib.asynccontextmanager
async def _open_ray(address: str, **options: Any) -> AsyncIterator[Backend]:
    """The Ray backend; ``supervisor.ray`` (and Ray) imported only here, on demand."""
    try:
        from .ray import RaySupervisor
    except ModuleNotFoundError as exc:
        if exc.name != "ray":
            raise
        from ._errors import TurnpoolError

        raise TurnpoolError("--ray needs Ray on this machine: pip install 'turnpool[ray]'") from None

    kwargs = {name: value for name, value in options.items() if value is not None}
    async with RaySupervisor(address, **kwargs) as sup:
        yield sup
