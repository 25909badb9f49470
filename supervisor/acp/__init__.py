"""The Agent Client Protocol front end (``turnpool acp``): ``stdio`` (the process and the stdio
transport), ``agent`` (sessions, prompts, cancel, on any ``Backend``), ``events`` (turn events to
ACP updates). Imports the optional ``acp`` package only when run."""
