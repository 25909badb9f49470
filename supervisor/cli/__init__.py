"""The ``turnpool`` command line: ``main`` (the parser and ``entry``, the console script),
``options`` (options shared by several commands — endpoint, workers, grace, kill-after, path —
declared and validated once), ``exits`` (the exit codes), and one module per command group:
``daemon`` (serve, submit, cancel, status), ``journal`` (history, result); ``batch`` and ``acp``
register from their own front ends (``supervisor.batch``, ``supervisor.acp``).

Kept free of imports: ``supervisor.cli.exits`` is imported by the batch runner.
"""
