"""An agent module whose import never returns (``tests.agents.stuck_import_block:agent``).

On import it writes its pid into ``$TURNPOOL_TEST_STUCK_DIR/import-block`` (so a test can wait for
the import to be under way), then spins without ever returning to the worker's event loop.
"""

from __future__ import annotations

import os

import worker

_dir = os.environ.get("TURNPOOL_TEST_STUCK_DIR")
if _dir:
    _tmp = os.path.join(_dir, f"import-block.{os.getpid()}.tmp")
    with open(_tmp, "w") as _f:
        _f.write(str(os.getpid()))
    os.replace(_tmp, os.path.join(_dir, "import-block"))
    while True:
        pass


async def agent(turn: worker.Turn) -> str:
    return "imported"
