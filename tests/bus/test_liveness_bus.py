"""What keeps a bus connection alive and its responders reachable, on a real nats-server (issue #19).

* `serve` returns only once the server has the subscription: a request sent from another connection right after it
  is answered. nats-py's flush() writes its PING past a SUB still in its write buffer, so a PONG alone used to let
  `serve` return early, and such a request got "nobody serves this subject" (the flaky
  tests/integration/test_loadaware_bind.py test).
* A subject longer than nats-server accepts is refused before anything is sent (bus.subjects.SubjectError), on both
  buses; on the real one the connection stays usable (nats-server used to drop it, and nats-py closed the client for
  good: every service of the process lost the bus).
* A closed bus leaves no reconnect loop behind, even one whose cancellation was lost (bus.jetstream._Client).
* A connection keeps reading: a PONG that comes after its flush timed out no longer ends nats-py's read loop, and a
  read loop ended by anything else is noticed by unanswered PINGs and reconnected (bus.jetstream._Client,
  PING_INTERVAL_SECONDS).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from bus import subjects
from bus.errors import BusUnavailableError
from bus.jetstream import JetStreamBus
from bus.memory import MemoryBus
from bus.server import EmbeddedNatsServer
from tests.bus import Names
from tests.support.waiting import eventually

ROUNDS = 40


async def test_a_request_right_after_serve_from_a_fresh_connection_is_answered(nats_url: str) -> None:
    async def echo(data: bytes) -> bytes:
        return data

    unanswered = []
    for round_ in range(ROUNDS):
        requester = await JetStreamBus.connect(nats_url, name="requester")
        responder_bus = await JetStreamBus.connect(nats_url, name="responder")
        subject = f"koord.v1.rpc.liveness.r{round_}"
        try:
            responder = await responder_bus.serve(subject, echo, queue="echo", concurrency=4)
            try:
                assert await requester.request(subject, b"ping", timeout=5) == b"ping"
            except Exception as e:  # counted: the assertion below names how many rounds failed
                unanswered.append(f"round {round_}: {e}")
            await responder.stop()
        finally:
            await requester.close()
            await responder_bus.close()
    assert unanswered == [], unanswered


@pytest.mark.parametrize("backend", ["memory", "jetstream"])
async def test_a_subject_too_long_for_the_server_is_refused_and_the_connection_lives(
    backend: str, request: pytest.FixtureRequest
) -> None:
    names = Names()
    bus: MemoryBus | JetStreamBus
    if backend == "memory":
        bus = MemoryBus()
    else:
        bus = await JetStreamBus.connect(request.getfixturevalue("nats_url"), name="long-subject")
    try:
        await bus.ensure_streams([names.stream_spec()])
        long_subject = names.subject("x" * 5000)
        with pytest.raises(subjects.SubjectError, match="longer than the 3840"):
            await bus.publish(long_subject, b"m", msg_id="long")
        with pytest.raises(subjects.SubjectError):
            await bus.publish_many([(names.subject("a"), b"m", "ok-0"), (long_subject, b"m", "long-1")])
        with pytest.raises(subjects.SubjectError):
            await bus.request(long_subject, b"m", timeout=1)
        ack = await bus.publish(names.subject("a"), b"m", msg_id="after")  # the same connection still works
        assert ack.seq == 1 and not ack.duplicate
    finally:
        await bus.close()


async def stopped(pid: int) -> None:
    """Return once the process is in the stopped state (`T` in /proc/<pid>/stat)."""

    def state() -> str:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]

    await eventually(lambda: state() == "T", timeout=5)


async def test_a_pong_for_a_flush_that_timed_out_leaves_the_connection_reading(tmp_path: Path) -> None:
    """nats-py 2.16 completes each PONG's future blindly: a flush that timed out cancelled its future, its late PONG
    raised InvalidStateError inside the read loop, and the loop ended without a word. The connection stayed
    "connected" while nothing was read any more: no consumer got a message, every publish timed out, and /healthz
    stayed 200 (seen under load in `koordbus up`, where nats-py's own reconnect flushes with a timeout). Here the
    server is paused past a flush's timeout and resumed, so the PONG comes late."""
    async with EmbeddedNatsServer(tmp_path / "nats") as server:
        bus = await JetStreamBus.connect(server.url, name="late-pong")
        try:
            client = bus.jetstream._nc
            os.kill(server.pid, signal.SIGSTOP)
            try:
                await stopped(server.pid)  # SIGSTOP is delivered asynchronously: a busy machine answered one PING first
                with pytest.raises(Exception, match=r"[Tt]imeout"):
                    await client.flush(timeout=1)
            finally:
                os.kill(server.pid, signal.SIGCONT)
            subject = "koord.v1.rpc.liveness.late-pong"

            async def echo(data: bytes) -> bytes:
                return data

            responder = await bus.serve(subject, echo, queue="echo")
            try:
                assert await bus.request(subject, b"still reading", timeout=5) == b"still reading"
            finally:
                await responder.stop()
        finally:
            await bus.close()


async def test_a_connection_that_stopped_reading_is_reconnected_once_its_pings_go_unanswered(nats_url: str) -> None:
    """Whatever else ends nats-py's read loop (it logs any unexpected error and stops reading), the client stays
    "connected": unanswered PINGs make it reconnect, which reads again."""
    bus = await JetStreamBus.connect(nats_url, name="stopped-reading", ping_interval=0.2)
    try:
        client = bus.jetstream._nc
        client._reading_task.cancel()  # the read loop ends as it does on an unexpected error
        subject = "koord.v1.rpc.liveness.stopped-reading"

        async def echo(data: bytes) -> bytes:
            return data

        async def answered() -> bool:
            try:
                responder = await bus.serve(subject, echo, queue="echo")
            except BusUnavailableError:
                return False
            try:
                return await bus.request(subject, b"reading again", timeout=2) == b"reading again"
            finally:
                await responder.stop()

        await eventually(answered, timeout=15)
    finally:
        await bus.close()


async def test_a_reconnect_loop_ends_once_the_bus_is_closing_even_if_its_cancellation_was_lost(tmp_path: Path) -> None:
    # JetStreamBus.close cancels nats-py's reconnect loop, but Python 3.11's wait_for (nats-py's connect timeout)
    # swallows a cancellation that lands as a refused attempt completes; the loop then retried a server that was gone
    # for ever, and asyncio.run's cleanup waited for it (`koordbus up` after SIGTERM reached it and its nats-server).
    # Here the loop is not cancelled at all: the bus marked closing must end it at its next attempt.
    async with EmbeddedNatsServer(tmp_path / "nats") as server:
        bus = await JetStreamBus.connect(server.url, name="closing")
        await server.kill()
        await eventually(lambda: bus.link.down_since is not None, timeout=5)
        loop_task = bus._nc._reconnection_task  # nats-py's reconnect loop, refused once a second
        assert loop_task is not None and not loop_task.done()
        bus._nc.closing = True  # what close() sets before anything else
        await eventually(loop_task.done, timeout=5)
        await bus.close()
