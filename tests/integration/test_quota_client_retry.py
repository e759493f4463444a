"""services.quota.client sends a request again when its answer is lost, and the quota service applies a command sent
twice once (issue 26 point 3), on a real nats-server: the service's append to the quota log is held longer than the
client's attempt waits, so the first attempt times out while its command is applied — as when a stream leader is
elected under the append — and the retry, under the same command id, is answered with the first answer's result
(a create not "already exists", a delete not "not found", an update with the version it was read at not a
conflict). A request nobody serves is retried until the service comes; a request that could have been handled and
is not safe to send again is not."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from bus import rpc, streams, subjects
from bus.errors import BusUnavailableError
from bus.jetstream import JetStreamBus
from bus.memory import MemoryBus
from schemas import quota_events as ev
from schemas.quota_service import CommandReply, CommandRequest
from services.common.metrics import new_registry
from services.quota.client import QuotaClient
from services.quota.service import QuotaService
from tests.integration.test_quota_service import SETTINGS
from tests.unit.test_quota_validation import eq

ATTEMPT_SECONDS = 0.5
HOLD_SECONDS = 1.5
"""How long the service's next append is held: three of the client's attempts."""


class HeldAppends:
    """The quota service's bus, holding its next append to the quota log when armed, and keeping every reply the
    service sends to a command (whether its caller still waits for it or not)."""

    def __init__(self, bus: JetStreamBus) -> None:
        self._bus = bus
        self._hold = 0.0
        self.replies: list[CommandReply] = []

    def hold_next_append(self, seconds: float) -> None:
        self._hold = seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    async def publish(self, subject: str, data: bytes, **options: Any) -> Any:
        if subject.startswith(subjects.QUOTA_EVENTS_ALL[:-1]) and self._hold:
            hold, self._hold = self._hold, 0.0
            await asyncio.sleep(hold)
        return await self._bus.publish(subject, data, **options)

    async def serve(self, subject: str, handler: Any, **options: Any) -> Any:
        if subject != subjects.QUOTA_RPC_COMMAND:
            return await self._bus.serve(subject, handler, **options)

        async def kept(data: bytes) -> bytes:
            reply: bytes = await handler(data)
            self.replies.append(msgspec.json.decode(reply, type=CommandReply))
            return reply

        return await self._bus.serve(subject, kept, **options)


async def _logged(bus: JetStreamBus, command_id: str) -> list[int]:
    """The stream sequences of the quota log's events of `command_id`."""
    found = await bus.read_recent(streams.KOORD_QUOTA, subjects.QUOTA_EVENTS_ALL, since=0, limit=10_000)
    return [d.stream_seq for d in found if ev.decode_quota_event(d.data).command_id == command_id]


async def _sent_once_answered_twice(
    held: HeldAppends, client: QuotaClient, bus: JetStreamBus, request: CommandRequest
) -> CommandReply:
    """Send `request` with the service's append held; the reply, checked against the service's first answer and the
    log (the command's one event)."""
    await asyncio.sleep(HOLD_SECONDS)  # the previous command's late attempts are answered
    held.replies.clear()
    held.hold_next_append(HOLD_SECONDS)
    reply = await client.command(request)
    first = held.replies[0]
    assert first.outcome == "applied" and not first.duplicate, first
    assert len(held.replies) > 1, "the first attempt was answered: nothing was retried"
    (seq,) = await _logged(bus, request.command.command_id)
    assert reply.outcome == "applied" and reply.duplicate, reply
    assert (reply.seq, reply.tree, reply.quota, reply.quotas) == (seq, first.tree, first.quota, first.quotas)
    return reply


async def test_a_command_whose_answer_is_lost_is_applied_once_and_answered_as_the_first_time(
    koordbus_nats_url: str,
) -> None:
    service_bus = await JetStreamBus.connect(koordbus_nats_url, name="quota-service")
    caller_bus = await JetStreamBus.connect(koordbus_nats_url, name="api")
    held = HeldAppends(service_bus)
    service_registry = new_registry()
    service = QuotaService(held, SETTINGS, registry=service_registry)  # type: ignore[arg-type]
    registry = new_registry()
    client = QuotaClient(caller_bus, timeout=ATTEMPT_SECONDS, within=10, registry=registry)
    try:
        await service.start()
        parent = eq("org", is_parent=True, min={"cpu": "8"}, max={"cpu": "8"})
        created = await client.command(
            CommandRequest(actor="alice", command=ev.CreateQuota(command_id="p", quota=parent))
        )
        assert created.outcome == "applied"

        team = eq("team", parent="org", min={"cpu": "2"}, max={"cpu": "4"})
        create = CommandRequest(actor="alice", command=ev.CreateQuota(command_id="create-team", quota=team))
        reply = await _sent_once_answered_twice(held, client, caller_bus, create)
        assert reply.quota is not None and reply.quota.metadata.name == "team"

        version = reply.quota.metadata.resource_version
        bigger = eq("team", parent="org", min={"cpu": "2"}, max={"cpu": "6"})
        update = CommandRequest(
            actor="alice",
            command=ev.UpdateQuota(command_id="update-team", quota=bigger),
            expected_resource_version=version,
        )
        reply = await _sent_once_answered_twice(held, client, caller_bus, update)
        assert reply.quota is not None and reply.quota.spec.max == {"cpu": "6"}

        delete = CommandRequest(actor="alice", command=ev.DeleteQuota(command_id="delete-team", name="team"))
        await _sent_once_answered_twice(held, client, caller_bus, delete)
        assert "team" not in service.model.state.quotas

        retried = registry.get_sample_value(
            "koordbus_quota_client_retries_total", {"request": "command", "reason": rpc.NO_ANSWER}
        )
        assert retried is not None and retried >= 3
        again = service_registry.get_sample_value("koordbus_quota_commands_again_total")
        assert again is not None and again >= 3
    finally:
        await service.stop()
        await caller_bus.close()
        await service_bus.close()


async def test_a_request_nobody_serves_waits_for_the_service(koordbus_nats_url: str) -> None:
    service_bus = await JetStreamBus.connect(koordbus_nats_url, name="quota-service")
    caller_bus = await JetStreamBus.connect(koordbus_nats_url, name="api")
    service = QuotaService(service_bus, SETTINGS, registry=new_registry())
    client = QuotaClient(caller_bus, timeout=ATTEMPT_SECONDS, within=20)
    try:
        request = CommandRequest(
            actor="alice",
            command=ev.CreateQuota(command_id="late", quota=eq("late", min={"cpu": "1"}, max={"cpu": "1"})),
        )
        asked = asyncio.create_task(client.command(request))
        await asyncio.sleep(1.0)
        assert not asked.done()  # no responders, retried
        await service.start()
        reply = await asyncio.wait_for(asked, 20)
        assert reply.outcome == "applied" and not reply.duplicate, reply
        assert len(await _logged(caller_bus, "late")) == 1
    finally:
        await service.stop()
        await caller_bus.close()
        await service_bus.close()


async def test_what_may_have_been_handled_is_not_sent_again_unless_safe() -> None:
    bus = MemoryBus()
    calls = 0

    async def slow(data: bytes) -> bytes:
        nonlocal calls
        calls += 1
        await asyncio.sleep(1.0)
        return data

    await bus.serve("koord.v1.rpc.test", slow, queue="q")
    with pytest.raises(BusUnavailableError) as raised:
        await rpc.request(bus, "koord.v1.rpc.test", b"x", attempt_timeout=0.1, within=5, handled_twice_is_safe=False)
    assert raised.value.reason == rpc.NO_ANSWER and calls == 1
    with pytest.raises(BusUnavailableError, match=r"attempt \d+, after"):
        await rpc.request(bus, "koord.v1.rpc.test", b"x", attempt_timeout=0.1, within=1.0, handled_twice_is_safe=True)
    assert calls > 2
    await bus.close()
