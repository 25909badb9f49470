"""ADAPT-PROBE: an agent name that points at something no worker can run (an ``int``, an object that
is not callable, a framework object whose extra is not installed) is refused at submit with
``InvalidAgent``, although the supervisor never imports agent code.

The first submit of a name this supervisor does not know yet asks the zygote for a probe: a fork
of it that imports the attribute as a worker would and classifies it (``worker._probe``). The
answer is kept per agent name until ``reload`` (``AgentKinds.kinds``), and ``Admission.accept``
refuses a name whose answer is a refusal with one dict look-up: every later submit of the name
pays nothing more. The wait is bounded (``PROBE_SECONDS``): a probe that does not answer in time
(an agent module slow to import, a zygote still preloading), whose import fails, or no zygote at
all (``zygote=False``, a ``python`` of its own) leaves the turn accepted as before, and it ends
``failed`` with the worker's error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import anyio

from .zygote import Zygote

PROBE_SECONDS = 2.0  # how long a submit of a name not known yet may wait for its probe
MOST_KNOWN = 4096  # agent names remembered; past that, names not known are accepted unprobed
MOST_PENDING = 16  # probes at once; past that, a new name is accepted unprobed


class AgentKinds:
    """What each agent name points at, as the zygote's probes answered; see the module docstring."""

    def __init__(self, zygote: Callable[[], Zygote | None]) -> None:
        self._zygote = zygote
        self.kinds: dict[str, str | None] = {}  # agent -> InvalidAgent's message, or None: accepted
        self._pending: dict[str, anyio.Event] = {}
        self.probes = 0  # probes asked for (status, tests)

    def clear(self) -> None:
        """``reload``: agent code may have changed, ask again."""
        self.kinds.clear()

    async def learn(self, agent: str) -> None:
        """Probe ``agent`` (or wait for the probe already asked for), bounded by ``PROBE_SECONDS``."""
        if agent in self.kinds:
            return
        asked = self._pending.get(agent)
        if asked is not None:
            with anyio.move_on_after(PROBE_SECONDS):
                await asked.wait()
            return
        zygote = self._zygote()
        if zygote is None or zygote.lost:
            self.kinds[agent] = None  # no zygote (for good): accepted as before, and never asked again
            return
        if len(self.kinds) >= MOST_KNOWN or len(self._pending) >= MOST_PENDING:
            return
        fd = zygote.probe(agent, PROBE_SECONDS)
        if fd is None:
            return
        self.probes += 1
        done = self._pending[agent] = anyio.Event()
        answer = b""
        finished = False
        try:
            with anyio.move_on_after(PROBE_SECONDS):
                while True:
                    await anyio.wait_readable(fd)
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        break
                    answer += chunk
            finished = True  # answered, or out of time: either way the name is known from now on
        finally:
            os.close(fd)
            del self._pending[agent]
            if finished:
                self.kinds[agent] = _refusal(answer)
            done.set()


def _refusal(answer: bytes) -> str | None:
    try:
        verdict = json.loads(answer)
    except ValueError:
        return None
    refused = verdict.get("refused") if isinstance(verdict, dict) else None
    return refused if isinstance(refused, str) else None
