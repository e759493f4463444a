"""koordbus.runtime.run_command: once a long-running command is stopping, its process exits within the shutdown
deadline even when a task left over after its stack closed ignores its cancellation (asyncio.run waits for such a
task forever: `koordbus up` did, on a nats-py reconnect loop, after SIGTERM reached it and its nats-server), and a
command that stops in time exits with its own code, the deadline never firing afterwards. Real processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from koordbus.runtime import SHUTDOWN_DEADLINE_SECONDS

COMMAND = """
import asyncio, os, signal
from contextlib import AsyncExitStack
from koordbus import runtime

async def stubborn() -> None:
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # a library's task that swallows its cancellation

async def main() -> int:
    async with AsyncExitStack() as stack:
        stop = runtime.stop_event_on_signals(stack)
        if STUBBORN:
            asyncio.get_running_loop().create_task(stubborn())
        os.kill(os.getpid(), signal.SIGTERM)
        await stop.wait()
    return 0

raise SystemExit(runtime.run_command(main()))
"""


def run(stubborn: bool) -> tuple[int, str, float]:
    script = textwrap.dedent(COMMAND).replace("STUBBORN", repr(stubborn))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=SHUTDOWN_DEADLINE_SECONDS + 30
    )
    return done.returncode, done.stderr, time.monotonic() - started


def test_a_task_that_ignores_its_cancellation_does_not_keep_the_process_past_the_deadline() -> None:
    code, stderr, took = run(stubborn=True)
    assert code == 1, stderr
    assert f"shutdown did not finish within {SHUTDOWN_DEADLINE_SECONDS:.0f} s" in stderr
    assert took < SHUTDOWN_DEADLINE_SECONDS + 5


def test_a_command_that_stops_in_time_exits_with_its_own_code() -> None:
    code, stderr, took = run(stubborn=False)
    assert code == 0, stderr
    assert "did not finish" not in stderr
    assert took < SHUTDOWN_DEADLINE_SECONDS
