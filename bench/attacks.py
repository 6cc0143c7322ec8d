"""Hostile clients for ``bench/faults.py``: each attack runs for a phase beside the valid load.

Every attack is an ``async (host, port, app_url, seconds, stats) -> None`` that keeps attacking
until ``seconds`` pass and then lets go of what it holds; ``stats`` counts what the server did
(answer statuses, connections it closed). Raw sockets (asyncio streams) where a well-behaved
client library would not misbehave this way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import real_node

Attack = Callable[[str, int, str, float, Counter[str]], Awaitable[None]]


async def _status(reader: asyncio.StreamReader, timeout_s: float) -> str:
    """The status of the server's answer, "closed" when it closed without one, "open" when it
    neither answered nor closed within ``timeout_s``."""
    try:
        line = await asyncio.wait_for(reader.readline(), timeout_s)
    except TimeoutError:
        return "open"
    except (ConnectionError, OSError):
        return "closed"
    parts = line.split()
    return parts[1].decode() if len(parts) > 1 else "closed"


async def _one_raw(host: str, port: int, data: bytes, stats: Counter[str], timeout_s: float = 15.0) -> None:
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        stats["connect failed"] += 1
        return
    try:
        with contextlib.suppress(ConnectionError, OSError):
            writer.write(data)
            await writer.drain()
        stats[await _status(reader, timeout_s)] += 1
    finally:
        writer.close()


async def header_flood(host: str, port: int, app_url: str, seconds: float, stats: Counter[str]) -> None:
    """Requests with a 100 KB header line, with 10,000 headers, and one 64 MB header line."""
    path = app_url.split(f"{port}", 1)[1]
    big_line = f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Big: {'a' * 100_000}\r\n\r\n".encode()
    many = (f"GET {path} HTTP/1.1\r\nHost: x\r\n".encode()
            + b"".join(b"X-%d: y\r\n" % i for i in range(10_000)) + b"\r\n")
    huge = f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Huge: ".encode() + b"h" * (64 << 20) + b"\r\n\r\n"
    end = time.monotonic() + seconds
    await _one_raw(host, port, huge, stats)
    k = 0
    while time.monotonic() < end:
        await asyncio.gather(*(_one_raw(host, port, big_line if (k + i) % 2 else many, stats)
                               for i in range(20)))
        k += 20
        await asyncio.sleep(0.05)


async def _hold(host: str, port: int, count: int, per_s: float, seconds: float, stats: Counter[str],
                send: Callable[[asyncio.StreamWriter], Awaitable[None]] | None = None) -> None:
    """Open ``count`` connections at ``per_s``, each doing ``send`` (None: nothing), hold them
    until ``seconds`` pass; counts how many the server closed meanwhile."""
    end = time.monotonic() + seconds
    writers: list[asyncio.StreamWriter] = []
    tasks: list[asyncio.Task[None]] = []
    closed = [0]

    async def watch(reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while await reader.read(65536):
                pass
        closed[0] += 1
    for i in range(count):
        if time.monotonic() >= end:
            break
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            stats["connect failed"] += 1
            await asyncio.sleep(0.01)
            continue
        writers.append(writer)
        tasks.append(asyncio.create_task(watch(reader)))
        if send is not None:
            tasks.append(asyncio.create_task(send(writer)))
        if i % 100 == 99:
            await asyncio.sleep(100 / per_s)
    stats["opened"] += len(writers)
    await asyncio.sleep(max(0.0, end - time.monotonic()))
    stats["closed by the server"] += closed[0]
    for t in tasks:
        t.cancel()
    for writer in writers:
        writer.close()


async def idle_connections(host: str, port: int, app_url: str, seconds: float, stats: Counter[str]) -> None:
    """10,000 connections that never send a byte."""
    await _hold(host, port, 10_000, 2500.0, seconds, stats)


async def stalled_bodies(host: str, port: int, app_url: str, seconds: float, stats: Counter[str]) -> None:
    """2,000 requests that announce a 1 MB body, send 1 KB of it and stall."""
    path = app_url.split(f"{port}", 1)[1]

    async def send(w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            w.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {1 << 20}\r\n\r\n".encode() + b"{" + b" " * 1023)
            await w.drain()
    await _hold(host, port, 2000, 1000.0, seconds, stats, send)


async def slow_heads(host: str, port: int, app_url: str, seconds: float, stats: Counter[str]) -> None:
    """2,000 connections that each send one header byte a second, never ending the head."""
    path = app_url.split(f"{port}", 1)[1]

    async def send(w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            w.write(f"POST {path} HTTP/1.1\r\nHost: x\r\n".encode())
            while True:
                await asyncio.sleep(1.0)
                w.write(b"X")
                await w.drain()
    await _hold(host, port, 2000, 1000.0, seconds, stats, send)


def _by_status(status: int, body: bytes) -> str:
    return str(status)


async def _posts(url: str, bodies: list[bytes], per_s: float, seconds: float, stats: Counter[str],
                 label: Callable[[int, bytes], str] = _by_status) -> None:
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        end = time.monotonic() + seconds
        k = 0
        pending: set[asyncio.Task[None]] = set()

        async def one(body: bytes) -> None:
            try:
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                    stats[label(r.status, await r.read())] += 1
            except (TimeoutError, aiohttp.ClientError):
                stats["no answer"] += 1
        while time.monotonic() < end:
            t = asyncio.create_task(one(bodies[k % len(bodies)]))
            pending.add(t)
            t.add_done_callback(pending.discard)
            k += 1
            await asyncio.sleep(1.0 / per_s)
        if pending:
            await asyncio.wait(pending, timeout=60)


def _image(shape: list[int], fill: int = 0) -> bytes:
    n = 1
    for d in shape:
        n *= d
    return json.dumps({"inputs": [{"name": "image", "datatype": "UINT8", "shape": shape,
                                   "data": [fill] * n}]}).encode()


async def poison(host: str, port: int, app_url: str, seconds: float, stats: Counter[str]) -> None:
    """Inputs a model cannot take: an empty image, zero-size axes (issue 38's [0, 0, 3])."""
    await _posts(app_url, [_image([0]), _image([0, 0, 3]), _image([1, 0])], 5.0, seconds, stats)


async def big_inputs(host: str, port: int, app_url: str, seconds: float, stats: Counter[str]) -> None:
    """Requests far larger than a ring slot (4 MB images, under the 16 MiB payload limit)."""
    body = json.dumps({"inputs": [{"name": "image", "datatype": "UINT8", "shape": [4 << 20],
                                   "data": [7] * (4 << 20)}]}).encode()
    await _posts(app_url, [body], 1.0, seconds, stats)


def _names_task_and_output(status: int, body: bytes) -> str:
    """The status, and for a 500 which output its error names (``real_node``'s tasks)."""
    if status != 500:
        return str(status)
    try:
        error = str(json.loads(body).get("error", ""))
    except (ValueError, AttributeError):
        error = ""
    if "task 'up'" in error and "output for task 'dec'" in error:
        return "500 naming up's child"
    if "task 'dec'" in error and "its outputs (" in error:
        return "500 naming dec's answer"
    return "500 otherwise"


async def oversized_outputs(host: str, port: int, app_url: str, seconds: float, stats: Counter[str]) -> None:
    """Requests that fit their rings whose outputs do not (``real_node``): a 160 KB waveform that
    ``up`` makes a 640 KB child, a 120 KB one that ``dec`` makes a 3.8 MB answer; 5 a second."""
    bodies = [real_node.infer_body(real_node.OVER_CHILD), real_node.infer_body(real_node.OVER_ANSWER)]
    await _posts(app_url, bodies, 5.0, seconds, stats, _names_task_and_output)


ATTACKS: dict[str, Attack] = {
    "poison": poison, "biginput": big_inputs, "oversized": oversized_outputs, "headers": header_flood,
    "idle": idle_connections, "stalled": stalled_bodies, "slowhead": slow_heads,
}


def describe(stats: Counter[str]) -> dict[str, Any]:
    return dict(sorted(stats.items()))


def main(argv: list[str]) -> int:
    """``python bench/attacks.py NAME HOST PORT APP_URL SECONDS``: one attack in a process of its
    own (so its sockets and loop do not slow the valid load's client); prints its stats as JSON."""
    name, host, port, url, seconds = argv
    stats: Counter[str] = Counter()
    asyncio.run(ATTACKS[name](host, int(port), url, float(seconds), stats))
    print(json.dumps(describe(stats)))
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))
