"""The daemon's durable journal (SQLite, its own writer process): ``store`` (``Journal``: accepting,
ending and compacting turns, the daemon's side), ``writer_link`` (how batches of rows reach the
writer process and its answers come back), ``writer`` (the writer process itself, run as a script),
``reader`` (reading a journal without owning it: recovery, id lookups, ``history``/``result``),
``schema`` (the file's tables and how a file is recognised), ``lock`` (one live daemon per journal).
The daemon (``supervisor/daemon/recovery.py``) puts it on its hooks."""

from .store import (
    DURABILITY,
    SCHEMA_VERSION,
    Journal,
    JournalError,
    RecoveredTurn,
    default_journal_path,
    lock_name,
    lookup,
    read_history,
    read_result,
    state_dir,
)

__all__ = [
    "DURABILITY",
    "SCHEMA_VERSION",
    "Journal",
    "JournalError",
    "RecoveredTurn",
    "default_journal_path",
    "lock_name",
    "lookup",
    "read_history",
    "read_result",
    "state_dir",
]
