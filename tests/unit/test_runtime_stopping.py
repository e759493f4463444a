"""How a long-running command stops when its parts ignore a cancellation (a library may swallow one: Python 3.11's
wait_for does when the awaited future completes as the cancellation lands, and nats-py's requests use it).

* koordbus.runtime.background: a background task whose cancellation was swallowed is cancelled again after
  CANCEL_GRACE_SECONDS when its stack closes (`koordbus up`'s simulated cluster, stopped during a request to a gone
  server, retried for ever and held the shutdown past its deadline), while one that ends within the grace has its
  `finally` run to the end.
* koordbus.runtime.run_command: once stopping, the process exits within the shutdown deadline even when a task left
  over after its stack closed ignores its cancellation (asyncio.run waits for such a task forever: `koordbus up`
  did, on a nats-py reconnect loop, after SIGTERM reached it and its nats-server), and a command that stops in time
  exits with its own code, the deadline never firing afterwards. Real processes.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from contextlib import AsyncExitStack

from koordbus import runtime
from koordbus.runtime import CANCEL_GRACE_SECONDS, SHUTDOWN_DEADLINE_SECONDS


async def test_a_background_task_that_swallowed_its_cancellation_is_cancelled_again() -> None:
    cancellations = 0

    async def swallows_one() -> None:
        nonlocal cancellations
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancellations += 1
                if cancellations > 1:
                    raise

    async with AsyncExitStack() as stack:
        task = runtime.background(stack, swallows_one(), name="swallows")
        await asyncio.sleep(0)  # running
    assert task.cancelled() and cancellations == 2


async def test_a_cancelled_background_task_finishes_its_finally_within_the_grace() -> None:
    closed = False

    async def closes_slowly() -> None:
        nonlocal closed
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(CANCEL_GRACE_SECONDS / 2)  # an HTTPS client's close, say
            closed = True

    async with AsyncExitStack() as stack:
        runtime.background(stack, closes_slowly(), name="closes")
        await asyncio.sleep(0)
    assert closed


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
