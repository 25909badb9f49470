"""The machine's floor for one round trip on the stack turnpool uses (ZeroMQ ipc, ROUTER/DEALER,
an asyncio loop with an FD reader on each side), measured in the same run as the scenarios."""

from __future__ import annotations

import asyncio
import tempfile
import time

import zmq


def _echo_child(endpoint: str) -> None:
    async def child() -> None:
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        s.send(b"hi")

        def readable() -> None:
            while s.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                m = s.recv()
                if m == b"q":
                    if not done.done():
                        done.set_result(None)
                    return
                s.send(m)

        loop.add_reader(s.getsockopt(zmq.FD), readable)
        readable()
        await done
        loop.remove_reader(s.getsockopt(zmq.FD))
        s.close(0)
        ctx.term()

    asyncio.run(child())


def asyncio_zmq_rtt(n: int) -> list[float]:
    """Round trips of a tiny frame between this process and an echo process."""
    d = tempfile.mkdtemp(prefix="tp-floor-")
    endpoint = f"ipc://{d}/s"
    import subprocess
    import sys

    # A fresh interpreter, not a fork: this process may hold threads (Ray, pools) from earlier peers.
    child = subprocess.Popen([sys.executable, "-m", "benchmarks._floor", endpoint])
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    r.setsockopt(zmq.LINGER, 0)
    r.bind(endpoint)

    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        got: list[list[bytes]] = []
        waiter: list[asyncio.Future[None] | None] = [None]

        def readable() -> None:
            while r.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                got.append(r.recv_multipart())
                w = waiter[0]
                if w is not None and not w.done():
                    w.set_result(None)

        fd = r.getsockopt(zmq.FD)
        loop.add_reader(fd, readable)
        while not got:
            waiter[0] = loop.create_future()
            readable()
            if not got:
                await waiter[0]
        ident = got[0][0]
        got.clear()
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            waiter[0] = loop.create_future()
            r.send_multipart([ident, b"x"])
            readable()
            if not got:
                await waiter[0]
            got.clear()
            out.append(time.perf_counter() - t0)
        r.send_multipart([ident, b"q"])
        loop.remove_reader(fd)
        return out

    try:
        return asyncio.run(main())
    finally:
        child.wait()
        r.close(0)
        ctx.term()
        import shutil

        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    import sys

    _echo_child(sys.argv[1])
