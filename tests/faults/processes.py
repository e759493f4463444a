"""Real processes for the failure-tolerance tests, and the checks that tell when they have caught up.

`KoordbusProcess` runs `python -m koordbus.cli …` with its output in a log file and can be killed (SIGKILL, the
crash the tests inject) or stopped (SIGTERM, which must exit 0). `consumers_caught_up` asks the nats-server whether
a service's durable consumers, recreated by the running process, have delivered and acked everything; `stream_messages`
reads a whole stream back for the assertions. Used by tests/faults/test_kill_and_restart.py and
tests/faults/test_nats_restart.py.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import nats
from nats.js.errors import NotFoundError

from bus.api import Delivery
from bus.jetstream import JetStreamBus

STOP_TIMEOUT_SECONDS = 20.0
LOG_TAIL_LINES = 40


class KoordbusProcess:
    """One `koordbus` command as a child process; each start appends to the same log (`log_path`)."""

    def __init__(self, arguments: Sequence[str], *, log_path: Path, env: Mapping[str, str] | None = None) -> None:
        self.arguments = list(arguments)
        self.log_path = log_path
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        """Wall-clock time of the last start (consumers created after it belong to this run)."""

    def start(self) -> None:
        if self.running:
            raise RuntimeError(f"{self.arguments} is already running")
        self.started_at = time.time()
        with self.log_path.open("ab") as log:
            log.write(f"---- start {' '.join(self.arguments)}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                [sys.executable, "-m", "koordbus.cli", *self.arguments],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("not started")
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        """The exit code once the process has exited by itself; None while it runs (or before it started)."""
        return None if self._process is None else self._process.poll()

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as when a node or the OOM killer takes the process."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
        if process is not None:
            process.wait()

    def stop(self) -> None:
        """SIGTERM and wait; AssertionError (with the log's tail) unless it exits 0 without a traceback."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise AssertionError(f"{self.arguments} did not stop on SIGTERM:\n{self.tail()}") from None
        assert code == 0, f"{self.arguments} exited with {code}:\n{self.tail()}"

    def assert_alive(self) -> None:
        assert self.running, f"{self.arguments} died:\n{self.tail()}"

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


async def consumers_exist(nats_url: str, durables: Sequence[tuple[str, str]], *, since: float) -> bool:
    """True when every (stream, durable) exists and was created at or after `since`."""
    return await _check_consumers(nats_url, durables, since=since, idle=False)


async def consumers_caught_up(nats_url: str, durables: Sequence[tuple[str, str]], *, since: float) -> bool:
    """True when every (stream, durable) exists, was created at or after `since` (by the process started then, not
    left over from a killed one) and has nothing left to deliver or waiting for an ack."""
    return await _check_consumers(nats_url, durables, since=since, idle=True)


async def _check_consumers(nats_url: str, durables: Sequence[tuple[str, str]], *, since: float, idle: bool) -> bool:
    connection = await nats.connect(nats_url, allow_reconnect=False, connect_timeout=2)
    try:
        manager = connection.jsm()
        for stream, durable in durables:
            try:
                info = await manager.consumer_info(stream, durable)
            except NotFoundError:
                return False
            created = info.created.timestamp() if isinstance(info.created, dt.datetime) else 0.0
            if created < since or (idle and (info.num_pending or info.num_ack_pending)):
                return False
        return True
    finally:
        await connection.close()


async def stream_messages(bus: JetStreamBus, stream: str, subject: str, *, limit: int = 100_000) -> list[Delivery]:
    """Every message stored on `subject` (wildcards allowed) in `stream`, oldest first."""
    return await bus.read_recent(stream, subject, since=0, limit=limit)


async def wait_for(check: Callable[[], Awaitable[bool]], *, timeout: float, what: str, interval: float = 0.1) -> None:
    """Poll the async `check()` until it returns True; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if await check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout:.0f} s")
        await asyncio.sleep(interval)
