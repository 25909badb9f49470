"""ADAPT-PROBE: what an agent name points at, answered in a process of the worker side before the
turn is accepted (the supervisor never imports agent code).

The zygote forks a probe per agent name the supervisor does not know yet (``_zygote.serve``): the
probe imports the attribute as a worker would (``_loop.load_agent``), recognises it
(``adapters.adapt``) and writes one JSON line on the pipe it was given, then exits:

* ``{"refused": message}`` - the attribute is no agent this worker can run (``InvalidAgent``: an
  unsupported type, or a framework object whose extra is missing or too old); the supervisor
  refuses every submit of that name with this message until ``reload``;
* ``{"ok": true}`` - an agent, run as today;
* ``{"unknown": why}`` - the import failed (the turn fails with its import error, as before).
"""

from __future__ import annotations

import json
import os
import signal


def classify(spec: str) -> dict[str, object]:
    from . import _loop, adapters

    try:
        _loop.load_agent(spec)
    except adapters.InvalidAgent as exc:
        return {"refused": str(exc)}
    except BaseException as exc:  # noqa: BLE001 - any other failure is the turn's to report
        return {"unknown": f"{type(exc).__name__}: {exc}"[:2000]}
    return {"ok": True}


def run(spec: str, answer_fd: int) -> None:
    """In the forked probe: classify ``spec``, write the answer on ``answer_fd``, exit."""
    from .proctree import _tree

    os.setsid()  # its own group: the zygote kills whatever the import started with it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _tree.set_parent_death_signal(signal.SIGKILL)  # dies with the zygote, hence with the supervisor
    try:
        answer = json.dumps(classify(spec)).encode() + b"\n"
        os.write(answer_fd, answer)
    except BaseException:  # noqa: BLE001 - the supervisor reads EOF: behaviour as without a probe
        pass
    os._exit(0)
