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
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, ParamSpec, TypeVar

import msgspec

from . import _toolchild, _tooltemplate
from ._toolerrors import CommandResult, ToolCrashed, ToolIsolationError, ToolKilled, raised
from ._toolerrors import for_frameworks as _flavoured
from ._toollimits import Limits

if TYPE_CHECKING:
    from . import _toolproc  # (imported by a call, not by the decorator: WORKER-LAZY)

_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()


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


def for_frameworks(exc: ToolIsolationError) -> ToolIsolationError:
    """The error as raised to the call's caller: in its framework's flavour, noted for the adapters
    (TOOL-TOLD-FOLLOWERS)."""
    return raised(_flavoured(exc))


def _finish_call(proc: _toolproc.Proc, o: _toolproc.Outcome) -> Any:
    lim = proc.limits
    msg: list[Any] | None = None
    if o.result and not o.truncated:
        with contextlib.suppress(msgspec.DecodeError):
            msg = _dec.decode(o.result)
    if msg and msg[0] == "fallback":  # its embryo did not find it (nothing of it ran): fork the caller
        raise _tooltemplate.Fallback(str(msg[1]))
    if msg and msg[0] == "setup":
        raise for_frameworks(ToolIsolationError(f"isolated call could not start: {msg[1]}: {msg[2]}"))
    if o.killed is None and msg and msg[0] == "memory" and "memory" not in proc.groups.dirs:
        o.killed = "memory"  # the fallback's RLIMIT_AS refused an allocation
    if o.killed is not None:
        sig = o.last_signal if o.last_signal not in (None, signal.SIGINT) else None
        raise for_frameworks(ToolKilled(o.killed, _limit_of(o.killed, lim), signal=sig))
    if msg is None or msg[0] == "stopped":
        st = o.status
        if os.WIFSIGNALED(st):
            raise for_frameworks(ToolCrashed(signal=os.WTERMSIG(st)))
        raise for_frameworks(ToolCrashed(exit_code=os.WEXITSTATUS(st) if os.WIFEXITED(st) else None))
    if msg[0] == "ok":
        return msg[1]
    if msg[0] == "memory":
        raise MemoryError()
    raise _rebuild(msg[1], msg[2], msg[3])


async def _run_async(
    start: Callable[[], _toolproc.Proc], relay: bool
) -> tuple[_toolproc.Proc, _toolproc.Outcome]:
    """Start and watch the call in a thread (a template's first call of a module imports it there:
    the event loop runs on meanwhile); a cancel of the awaiting task runs the ladder, and the await
    returns (re-raising the cancel) only once the call's tree is gone."""
    import anyio  # (here: a process that only makes sync calls, or a template, never imports it)
    import anyio.lowlevel
    import anyio.to_thread

    lock = threading.Lock()
    state: dict[str, Any] = {"proc": None, "cancelled": False}

    def work() -> tuple[_toolproc.Proc, _toolproc.Outcome]:
        proc = start()
        with lock:
            state["proc"] = proc
            if state["cancelled"]:
                proc.cancel()  # (read at once by the watch: the ladder starts there)
        return proc, proc.watch(relay)

    async with anyio.create_task_group() as group:

        async def on_cancel() -> None:
            try:
                await anyio.sleep_forever()
            finally:
                with lock:
                    state["cancelled"] = True
                    proc = state["proc"]
                if proc is not None:
                    proc.cancel()

        group.start_soon(on_cancel)
        try:
            proc, outcome = await anyio.to_thread.run_sync(work)
        finally:
            group.cancel_scope.cancel()
    if outcome.killed == "cancelled":
        await anyio.lowlevel.checkpoint()  # the caller's cancel goes on, now that the call is gone
    return proc, outcome


_NOT_WARM: set[tuple[str, str]] = set()  # functions a template answered "fallback" for


def _reference(fn: Callable[..., Any], wrapper: Any) -> tuple[str, str] | None:
    """(module, qualified name) by which a template finds ``fn``, or None: not a module-level
    function reachable by that name (a lambda, a nested function, ``__main__``)."""
    module, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qual, str) or module == "__main__" or "<" in qual:
        return None
    obj: Any = sys.modules.get(module)
    for part in qual.split("."):
        obj = getattr(obj, part, None)
    return (module, qual) if obj is fn or obj is wrapper else None


def _warm_start(kind: str, limits: Limits, req: dict[str, Any], stdin: bytes | None) -> _toolproc.Proc | None:
    """TOOL-WARM: the call made by this process's template, or None: fork the caller instead."""
    from . import _toolproc

    for _ in range(2):
        template = _tooltemplate.get(kind)
        if template is None:
            return None
        try:
            return _toolproc.start_in_template(template, limits, req, stdin=stdin)
        except _tooltemplate.Fallback as exc:
            if kind == "fn":
                _NOT_WARM.add((req["mod"], req["qual"]))
            if exc.retire:
                _tooltemplate.drop(template)
            return None
        except OSError:
            _tooltemplate.drop(template)  # it died (killed from outside?): once more with a new one
    return None


class Isolated:
    """A function whose every call runs in its own process (see ``worker.isolated``)."""

    def __init__(self, fn: Callable[..., Any], limits: Limits, fork_caller: bool = False) -> None:
        self.fn = fn
        self.limits = limits
        self.fork_caller = fork_caller
        self.is_async = inspect.iscoroutinefunction(fn)
        self._ref: tuple[str, str] | bool | None = False  # False: not looked up yet
        functools.update_wrapper(self, fn)

    def _start(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], bound: tuple[Any, ...] = ()
    ) -> _toolproc.Proc:
        name = getattr(self.fn, "__name__", "tool")
        if not bound and not self.fork_caller:
            if self._ref is False:
                self._ref = _reference(self.fn, self)
            ref = self._ref
            if isinstance(ref, tuple) and ref not in _NOT_WARM:
                try:
                    payload = _enc.encode([args, kwargs])
                except (TypeError, ValueError, msgspec.EncodeError):
                    _check_crossing(args, dict(kwargs), name)  # names the argument
                    raise
                req = {
                    "kind": "fn",
                    "mod": ref[0],
                    "qual": ref[1],
                    "async": self.is_async,
                    "args": payload,
                    "path": sys.path,
                    "cwd": os.getcwd(),
                }
                proc = _warm_start("fn", self.limits, req, None)
                if proc is not None:
                    return proc
        kwargs = dict(kwargs)
        args = bound + _check_crossing(args, kwargs, name)
        from . import _toolproc

        return _toolproc.start(self.limits, _toolchild.child_body(self.fn, args, kwargs, self.is_async))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call((), args, kwargs)

    def _check_early(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """TOOL-CROSS at the call itself (an async call starts in a thread): what cannot cross."""
        try:
            _enc.encode([args, kwargs])
        except (TypeError, ValueError, msgspec.EncodeError):
            _check_crossing(args, dict(kwargs), getattr(self.fn, "__name__", "tool"))
            raise

    def _call(self, bound: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.is_async:
            return self._acall(bound, args, kwargs)
        proc = self._start(args, kwargs, bound)
        try:
            return _finish_call(proc, proc.watch())
        except _tooltemplate.Fallback:
            self._not_warm()
            return self._call(bound, args, kwargs)

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        """The call, awaitable whatever the function is: a cancel runs the call's ladder."""
        return await self._acall((), args, kwargs)

    async def _acall(self, bound: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self._check_early(args, kwargs)
        proc, outcome = await _run_async(lambda: self._start(args, kwargs, bound), True)
        try:
            return _finish_call(proc, outcome)
        except _tooltemplate.Fallback:
            self._not_warm()
            return await self._acall(bound, args, kwargs)

    def _not_warm(self) -> None:
        """Its template's embryo did not find it by name: its calls fork the caller from now on."""
        if isinstance(self._ref, tuple):
            _NOT_WARM.add(self._ref)

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
    fork_caller: bool = False,
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
        return Isolated(fn, limits, bool(fork_caller))
    return lambda f: Isolated(f, limits, bool(fork_caller))


class _Command(NamedTuple):
    """A command checked and ready to start: what ``run_command``'s parameters come to."""

    argv: list[str]
    limits: Limits
    cwd: str | None
    stdin: bytes


def _command(
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
) -> _Command:
    """The parameters of ``run_command`` and ``arun_command``, declared once (both are made from this
    function's signature, so the two cannot drift): checked, and made into the command's limits."""
    if isinstance(argv, (str, bytes)) or not argv or not all(isinstance(a, str) for a in argv):
        raise TypeError("run_command takes argv as a non-empty list of str (no shell)")
    if stdin is not None and not isinstance(stdin, (bytes, bytearray, memoryview)):
        raise TypeError("stdin must be bytes or None")
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
    return _Command(list(argv), limits, cwd, bytes(stdin) if stdin is not None else b"")


def _start_command(cmd: _Command) -> _toolproc.Proc:
    from . import _toolproc

    argv, cwd = cmd.argv, cmd.cwd
    req = {"kind": "cmd", "argv": argv, "cwd": os.path.join(os.getcwd(), cwd or "")}
    proc = _warm_start("cmd", cmd.limits, req, cmd.stdin or None)  # (none: /dev/null, no pipe)
    if proc is not None:
        return proc

    def body(fd: int) -> None:
        if cwd is not None:
            os.chdir(cwd)
        env = dict(os.environ)
        try:
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            _toolchild.report_setup_error(fd, exc)
        os._exit(127)

    return _toolproc.start(cmd.limits, body, stdin=cmd.stdin)


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


_P = ParamSpec("_P")
_F = TypeVar("_F", bound=Callable[..., Any])


def _public(fn: _F, params_of: Callable[..., Any]) -> _F:
    """``fn`` (which takes ``*args, **kwargs``) shown with ``params_of``'s parameters and its own return."""
    shown = inspect.signature(params_of).replace(return_annotation=inspect.signature(fn).return_annotation)
    fn.__signature__ = shown  # type: ignore[attr-defined]
    fn.__qualname__ = fn.__name__
    return fn


def _sync_command(prepare: Callable[_P, _Command]) -> Callable[_P, CommandResult]:
    def run_command(*args: _P.args, **kwargs: _P.kwargs) -> CommandResult:
        """Run ``argv`` (no shell) under the limits and ladder of an isolated call; returns when the
        command and everything it started are gone. Stops are reported in ``killed_reason``."""
        proc = _start_command(prepare(*args, **kwargs))
        return _command_result(proc, proc.watch(relay=False))

    return _public(run_command, prepare)


def _async_command(prepare: Callable[_P, _Command]) -> Callable[_P, Coroutine[Any, Any, CommandResult]]:
    async def arun_command(*args: _P.args, **kwargs: _P.kwargs) -> CommandResult:
        """``run_command`` for async code: the event loop runs on, and a cancel runs the ladder."""
        cmd = prepare(*args, **kwargs)
        proc, outcome = await _run_async(lambda: _start_command(cmd), False)
        return _command_result(proc, outcome)

    return _public(arun_command, prepare)


run_command = _sync_command(_command)
arun_command = _async_command(_command)


def current_call_cancelled() -> bool:
    """Inside an isolated call: whether its ladder asked it to stop (timeout or cancel)."""
    return _toolchild.current_call_cancelled()
