#!/usr/bin/env python3
"""A stand-in for the ``claude`` CLI that speaks the Claude Agent SDK's stream-json protocol over
stdin/stdout (``--input-format stream-json --output-format stream-json``), with no model service:
what it answers depends on the prompt's first word.

* ``hello``: streams "Hello from Claude." (text deltas as ``stream_event`` when the SDK asked for
  partial messages), a thinking block, one ``Bash`` tool use and its result, then ``result``;
* ``forever``: starts a child process (``sleep``), says its pid and the CLI's in a ``system``
  message, then streams deltas until the SDK's ``interrupt`` control request (answers it, writes
  "interrupted" to the file named by the prompt's second word if any, ends the turn with an
  ``error_during_execution`` result) and exits on stdin EOF;
* ``words N``: streams N words, then ``result`` (for the benchmarks);
* ``daemon PIDFILE``: a ``Bash`` tool use that leaves a setsid daemon (its pid in PIDFILE), then
  ``result`` "done";
* ``stubborn``: as ``forever``, but ignores ``interrupt``, SIGTERM and stdin EOF (only SIGKILL ends it).

With ``FAKE_CLAUDE_MUTE`` in its environment it never answers a control request (the SDK's
``initialize`` included: its ``connect()`` waits) and exits on stdin EOF.

Stdlib only: it runs under any ``python3``.
"""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid

SESSION = str(uuid.uuid4())
out_lock = threading.Lock()


def send(obj):
    with out_lock:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def reader(inbox):
    for line in sys.stdin:
        line = line.strip()
        if line:
            inbox.put(json.loads(line))
    inbox.put(None)  # EOF


def answer(request, response=None):
    send(
        {
            "type": "control_response",
            "response": {
                "subtype": "success",
                "request_id": request["request_id"],
                "response": response or {},
            },
        }
    )


def assistant(blocks):
    send(
        {
            "type": "assistant",
            "message": {"id": "msg_1", "model": "stand-in", "role": "assistant", "content": blocks},
            "session_id": SESSION,
            "parent_tool_use_id": None,
        }
    )


def text_delta(text, kind="text"):
    event = {"type": "content_block_delta", "index": 0, "delta": {"type": f"{kind}_delta", kind: text}}
    send({"type": "stream_event", "uuid": str(uuid.uuid4()), "session_id": SESSION, "event": event})


def result(text, subtype="success", is_error=False):
    send(
        {
            "type": "result",
            "subtype": subtype,
            "duration_ms": 1,
            "duration_api_ms": 0,
            "is_error": is_error,
            "num_turns": 1,
            "session_id": SESSION,
            "result": text,
        }
    )


def init(**extra):
    send(
        {"type": "system", "subtype": "init", "session_id": SESSION, "claude_code_version": "2.1.0", **extra}
    )


def hello(partial):
    init()
    words = ["Hello ", "from ", "Claude."]
    if partial:
        text_delta("The user greets me.", "thinking")
    assistant([{"type": "thinking", "thinking": "The user greets me.", "signature": "s"}])
    tool = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "echo hi"}}
    assistant([tool])
    send(
        {
            "type": "user",
            "message": {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "hi", "is_error": False}
                ],
            },
            "session_id": SESSION,
            "parent_tool_use_id": None,
        }
    )
    if partial:
        for word in words:
            text_delta(word)
    assistant([{"type": "text", "text": "".join(words)}])
    result("".join(words))


def words(count, partial):
    """Streams ``count`` words (text deltas with partial messages), then ``result``."""
    init()
    text = [f"w{i} " for i in range(count)]
    if partial:
        for word in text:
            text_delta(word)
    assistant([{"type": "text", "text": "".join(text)}])
    result("".join(text))


def daemon(pidfile):
    """Its ``Bash`` tool leaves a setsid daemon behind (``daemon_tool.py``), then the turn ends."""
    init()
    tool = {"type": "tool_use", "id": "toolu_d", "name": "Bash", "input": {"command": "daemon"}}
    assistant([tool])
    helper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "daemon_tool.py")
    subprocess.run([sys.executable, "-P", helper, pidfile], check=True, timeout=60)
    with open(pidfile) as f:
        pid = f.read()
    content = [{"type": "tool_result", "tool_use_id": "toolu_d", "content": pid, "is_error": False}]
    send(
        {
            "type": "user",
            "message": {"role": "user", "content": content},
            "session_id": SESSION,
            "parent_tool_use_id": None,
        }
    )
    assistant([{"type": "text", "text": "done"}])
    result("done")


def endless(inbox, partial, stubborn, mark):
    child = subprocess.Popen(["sleep", "1000"])
    init(cli_pid=os.getpid(), child_pid=child.pid)
    interrupted = False
    while True:
        try:
            msg = inbox.get(timeout=0.02)
        except queue.Empty:
            msg = "tick"
        if msg is None:
            if stubborn:
                continue  # stdin closed: ignored
            return
        if (
            isinstance(msg, dict)
            and msg.get("type") == "control_request"
            and msg["request"].get("subtype") == "interrupt"
            and not stubborn
        ):
            answer(msg)
            interrupted = True
            if mark:
                with open(mark, "w") as f:
                    f.write("interrupted")
            result("", subtype="error_during_execution", is_error=True)
        if not interrupted and partial:
            text_delta("more ")


def main():
    args = sys.argv[1:]
    if "-v" in args or "--version" in args:
        print("2.1.0 (Claude Code)")
        return
    partial = "--include-partial-messages" in args
    inbox = queue.Queue()
    threading.Thread(target=reader, args=(inbox,), daemon=True).start()
    while True:
        msg = inbox.get()
        if msg is None:
            return
        if msg.get("type") == "control_request":
            if os.environ.get("FAKE_CLAUDE_MUTE"):
                continue
            answer(msg, {"commands": [], "output_style": "default"})
        elif msg.get("type") == "user":
            content = msg["message"]["content"]
            prompt = content if isinstance(content, str) else content[0].get("text", "")
            word = prompt.split()[0].strip(",.:!") if prompt.split() else ""
            if word == "hello":
                hello(partial)
            elif word == "words":
                words(int(prompt.split()[1]), partial)
            elif word == "daemon":
                daemon(prompt.split()[1])
            elif word in ("forever", "stubborn"):
                if word == "stubborn":
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                endless(
                    inbox, partial, word == "stubborn", prompt.split()[1] if len(prompt.split()) > 1 else ""
                )
                if word == "stubborn":
                    while True:
                        time.sleep(1)  # allowed: the agent's or tool's own work under test, not a wait
                return
            else:
                result(f"unknown prompt {prompt!r}", subtype="error_during_execution", is_error=True)


if __name__ == "__main__":
    main()
