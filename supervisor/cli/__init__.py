"""The ``turnpool`` command line: ``main`` (the parser and ``entry``, the console script),
``options`` (options shared by several commands — endpoint, workers, grace, kill-after, path —
declared and validated once), and one module per command group (the exit codes are named once,
in ``supervisor/_exitcodes.py``, which the front ends share):
``serve`` (the daemon), ``daemon_client`` (submit, cancel, status, reload: a running daemon),
``journal`` (history, result: a daemon's journal file); ``batch`` and ``acp``
register from their own front ends (``supervisor.batch``, ``supervisor.acp``).
"""
