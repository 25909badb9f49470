"""``worker.isolated`` and ``worker.run_command``: a tool call in its own process, with its own limits
and ladder (the machinery is in ``_toolproc``). TOOL-CROSS: arguments and results cross as msgspec values;
what cannot cross is refused at the call, naming where."""

from __future__ import annotations

import builtins
import contextlib
import functools
import inspect
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import msgspec

from . import _toolchild, _toolproc
from ._toolerrors import CommandResult, ToolCrashed, ToolIsolationError, ToolKilled
from ._toolproc import Limits

_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()


def report_setup_error(fd: int, exc: BaseException) -> None:
    """In the child: the call could not be set up (or exec failed): tell the parent."""
    errno = exc.errno if isinstance(exc, OSError) else None
    _write_all(fd, _enc.encode(["setup", type(exc).__name__, str(exc), errno]))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _check_crossing(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> tuple[Any, ...]:
    """The arguments as they will be seen by the call (decoded copies), or TypeError naming which."""
    out: list[Any] = []
    for i, value in enumerate(args):
        out.append(_cross(value, f"argument {i} of {name}()"))
    for key, value in kwargs.items():
        kwargs[key] = _cross(value, f"argument {key!r} of {name}()")
    return tuple(out)


def _cross(value: Any, where: str) -> Any:
    try:
        return _dec.decode(_enc.encode(value))
    except (TypeError, ValueError, msgspec.EncodeError) as exc:
        raise TypeError(f"{where} cannot cross to an isolated call (not a msgspec value): {exc}") from None


def _child_body(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], is_async: bool
) -> Callable[[int], None]:
    def body(fd: int) -> None:
        try:
            if is_async:
                value = _run_async_in_child(fn, args, kwargs)
            else:
                value = fn(*args, **kwargs)
            try:
                payload = _enc.encode(["ok", value])
            except (TypeError, ValueError, msgspec.EncodeError) as exc:
                payload = _enc.encode(
                    [
                        "raised",
                        "builtins",
                        "TypeError",
                        [f"result of {fn.__name__}() cannot cross back: {exc}"],
                    ]
                )
        except _toolchild.CallInterrupted:
            payload = _enc.encode(["stopped"])
        except MemoryError:
            payload = _enc.encode(["memory"])
        except BaseException as exc:  # noqa: BLE001 - told to the caller
            args_ = [a if isinstance(a, (str, int, float, bool, type(None))) else repr(a) for a in exc.args]
            payload = _enc.encode(["raised", type(exc).__module__, type(exc).__qualname__, args_])
        with contextlib.suppress(OSError):
            _write_all(fd, payload)
            os.close(fd)
        _toolchild.end_own_tree()
        os._exit(0)

    return body


def _run_async_in_child(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    import asyncio

    asyncio.events._set_running_loop(None)  # forked from inside the caller's running loop
    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(fn(*args, **kwargs))

        def interrupt() -> None:
            _toolchild._call_cancelled = True
            task.cancel()

        loop.add_signal_handler(signal.SIGINT, interrupt)
        try:
            return loop.run_until_complete(task)
        except asyncio.CancelledError:
            raise _toolchild.CallInterrupted("isolated call asked to stop") from None
    finally:
        with contextlib.suppress(Exception):
            loop.close()


def _rebuild(module: str, qualname: str, args: list[Any]) -> BaseException:
    """The call's exception, as the caller's own class where it has it (a forked call shares the
    caller's classes), else a RuntimeError naming it."""
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if isinstance(obj, type) and issubclass(obj, Exception):
        with contextlib.suppress(Exception):
            return obj(*args)
    return RuntimeError(f"{module}.{qualname}: {', '.join(map(str, args))}")


def _limit_of(reason: str, lim: Limits) -> float | None:
    return {
        "memory": lim.memory_mb,
        "timeout": lim.timeout,
        "cpu": lim.cpu_s,
        "pids": lim.pids,
        "output": lim.output_mb,
        "cancelled": None,
    }.get(reason)


def _finish_call(proc: _toolproc.Proc, o: _toolproc.Outcome) -> Any:
    lim = proc.limits
    msg: list[Any] | None = None
    if o.result and not o.truncated:
        with contextlib.suppress(msgspec.DecodeError):
            msg = _dec.decode(o.result)
    if msg and msg[0] == "setup":
        raise ToolIsolationError(f"isolated call could not start: {msg[1]}: {msg[2]}")
    if o.killed is None and msg and msg[0] == "memory" and "memory" not in proc.groups.dirs:
        o.killed = "memory"  # the fallback's RLIMIT_AS refused an allocation
    if o.killed is not None:
        sig = o.last_signal if o.last_signal not in (None, signal.SIGINT) else None
        raise ToolKilled(o.killed, _limit_of(o.killed, lim), signal=sig)
    if msg is None or msg[0] == "stopped":
        st = o.status
        if os.WIFSIGNALED(st):
            raise ToolCrashed(signal=os.WTERMSIG(st))
        raise ToolCrashed(exit_code=os.WEXITSTATUS(st) if os.WIFEXITED(st) else None)
    if msg[0] == "ok":
        return msg[1]
    if msg[0] == "memory":
        raise MemoryError()
    raise _rebuild(msg[1], msg[2], msg[3])


async def _watch_async(proc: _toolproc.Proc, relay: bool) -> _toolproc.Outcome:
    """Watch the call in a thread; a cancel of the awaiting task runs the ladder, and the await
    returns (re-raising the cancel) only once the call's tree is gone."""
    async with anyio.create_task_group() as group:

        async def on_cancel() -> None:
            try:
                await anyio.sleep_forever()
            finally:
                proc.cancel()

        group.start_soon(on_cancel)
        try:
            outcome = await anyio.to_thread.run_sync(proc.watch, relay)
        finally:
            group.cancel_scope.cancel()
    if outcome.killed == "cancelled":
        await anyio.lowlevel.checkpoint()  # the caller's cancel goes on, now that the call is gone
    return outcome


class Isolated:
    """A function whose every call runs in its own process (see ``worker.isolated``)."""

    def __init__(self, fn: Callable[..., Any], limits: Limits) -> None:
        self.fn = fn
        self.limits = limits
        self.is_async = inspect.iscoroutinefunction(fn)
        functools.update_wrapper(self, fn)

    def _start(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], bound: tuple[Any, ...] = ()
    ) -> _toolproc.Proc:
        kwargs = dict(kwargs)
        args = bound + _check_crossing(args, kwargs, getattr(self.fn, "__name__", "tool"))
        return _toolproc.start(self.limits, _child_body(self.fn, args, kwargs, self.is_async))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call((), args, kwargs)

    def _call(self, bound: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.is_async:
            return self._acall(bound, args, kwargs)
        proc = self._start(args, kwargs, bound)
        return _finish_call(proc, proc.watch())

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        """The call, awaitable whatever the function is: a cancel runs the call's ladder."""
        return await self._acall((), args, kwargs)

    async def _acall(self, bound: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        proc = self._start(args, kwargs, bound)
        return _finish_call(proc, await _watch_async(proc, True))

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        # A method: the instance is the caller's own, carried by the fork (it does not cross, and what
        # the call changes in it does not come back); the other arguments cross as usual.
        return self if obj is None else _Bound(self, obj)


class _Bound:
    def __init__(self, isolated: Isolated, obj: Any) -> None:
        self._isolated, self._obj = isolated, obj

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._isolated._call((self._obj,), args, kwargs)

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        return await self._isolated._acall((self._obj,), args, kwargs)


def isolated(
    fn: Callable[..., Any] | None = None,
    *,
    memory_mb: float | None = 256,
    timeout: float | None = 30.0,
    cpu_s: float | None = None,
    pids: int | None = 64,
    output_mb: float | None = 8,
    env: dict[str, str] | None = None,
    network: bool = True,
    grace: float = 1.0,
    kill_after: float = 1.0,
    cgroups: bool | None = None,
) -> Any:
    """Run each call of ``fn`` in a child process of the caller, under its own limits and ladder.

    ``@worker.isolated``, ``@worker.isolated(memory_mb=...)`` or ``worker.isolated(fn, ...)``.
    A stopped call raises ``ToolKilled``, a dead one ``ToolCrashed``; see docs/tools.md."""
    limits = Limits(
        memory_mb,
        timeout,
        cpu_s,
        pids,
        output_mb,
        dict(env) if env is not None else None,
        bool(network),
        grace,
        kill_after,
        cgroups,
    )
    limits.check()
    if fn is not None:
        if not callable(fn):
            raise TypeError(f"worker.isolated wraps a function, not {fn!r}")
        return Isolated(fn, limits)
    return lambda f: Isolated(f, limits)


def _command_limits(
    timeout: float | None,
    memory_mb: float | None,
    pids: int | None,
    env: dict[str, str] | None,
    output_mb: float | None,
    network: bool,
    grace: float,
    kill_after: float,
    cgroups: bool | None,
) -> Limits:
    limits = Limits(
        memory_mb,
        timeout,
        None,
        pids,
        output_mb,
        dict(env) if env is not None else None,
        bool(network),
        grace,
        kill_after,
        cgroups,
    )
    limits.check()
    return limits


def _start_command(
    argv: Sequence[str], limits: Limits, cwd: str | None, stdin: bytes | None
) -> _toolproc.Proc:
    if isinstance(argv, (str, bytes)) or not argv or not all(isinstance(a, str) for a in argv):
        raise TypeError("run_command takes argv as a non-empty list of str (no shell)")
    if stdin is not None and not isinstance(stdin, (bytes, bytearray, memoryview)):
        raise TypeError("stdin must be bytes or None")
    argv = list(argv)

    def body(fd: int) -> None:
        if cwd is not None:
            os.chdir(cwd)
        env = dict(os.environ)
        try:
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            report_setup_error(fd, exc)
        os._exit(127)

    return _toolproc.start(limits, body, stdin=bytes(stdin) if stdin is not None else b"")


def _command_result(proc: _toolproc.Proc, o: _toolproc.Outcome) -> CommandResult:
    if o.result:
        with contextlib.suppress(msgspec.DecodeError):
            msg = _dec.decode(o.result)
            if msg and msg[0] == "setup":
                cls = getattr(builtins, msg[1], OSError)
                if isinstance(cls, type) and issubclass(cls, OSError) and msg[3] is not None:
                    raise cls(msg[3], msg[2])
                raise ToolIsolationError(f"command could not start: {msg[1]}: {msg[2]}")
    st = o.status
    code = -os.WTERMSIG(st) if os.WIFSIGNALED(st) else os.WEXITSTATUS(st)
    return CommandResult(code, bytes(o.out), bytes(o.err), o.truncated, o.killed)


def run_command(
    argv: Sequence[str],
    *,
    timeout: float | None = 30.0,
    memory_mb: float | None = 256,
    pids: int | None = 64,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    output_mb: float | None = 8,
    network: bool = True,
    grace: float = 1.0,
    kill_after: float = 1.0,
    cgroups: bool | None = None,
) -> CommandResult:
    """Run ``argv`` (no shell) under the limits and ladder of an isolated call; returns when the
    command and everything it started are gone. Stops are reported in ``killed_reason``."""
    limits = _command_limits(timeout, memory_mb, pids, env, output_mb, network, grace, kill_after, cgroups)
    proc = _start_command(argv, limits, cwd, stdin)
    return _command_result(proc, proc.watch(relay=False))


async def arun_command(
    argv: Sequence[str],
    *,
    timeout: float | None = 30.0,  # noqa: ASYNC109 - the command's limit, not a wait of ours
    memory_mb: float | None = 256,
    pids: int | None = 64,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    output_mb: float | None = 8,
    network: bool = True,
    grace: float = 1.0,
    kill_after: float = 1.0,
    cgroups: bool | None = None,
) -> CommandResult:
    """``run_command`` for async code: the event loop runs on, and a cancel runs the ladder."""
    limits = _command_limits(timeout, memory_mb, pids, env, output_mb, network, grace, kill_after, cgroups)
    proc = _start_command(argv, limits, cwd, stdin)
    return _command_result(proc, await _watch_async(proc, False))


def current_call_cancelled() -> bool:
    """Inside an isolated call: whether its ladder asked it to stop (timeout or cancel)."""
    return _toolchild.current_call_cancelled()
