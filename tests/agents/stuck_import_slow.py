"""An agent module whose import takes ``$TURNPOOL_TEST_SLOW_IMPORT_S`` seconds, then returns
(``tests.agents.stuck_import_slow:agent``): a slow import that finishes after a cancel.

On import it writes its pid into ``$TURNPOOL_TEST_STUCK_DIR/import-slow`` first, so a test can wait
for the import to be under way.
"""

from __future__ import annotations

import os
import time

import worker

_dir = os.environ.get("TURNPOOL_TEST_STUCK_DIR")
if _dir:
    _tmp = os.path.join(_dir, f"import-slow.{os.getpid()}.tmp")
    with open(_tmp, "w") as _f:
        _f.write(str(os.getpid()))
    os.replace(_tmp, os.path.join(_dir, "import-slow"))
    # allowed: the slow import under test
    time.sleep(float(os.environ.get("TURNPOOL_TEST_SLOW_IMPORT_S", "3")))  # allowed: a slow import


async def agent(turn: worker.Turn) -> str:
    return "imported"
