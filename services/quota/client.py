"""Asking the quota service: commands, admission checks and what-ifs over the bus's request/reply.

Used by the API gateway (services.quota.routes), which may run in another process than the quota service (or several
of them: the requests go to the queue group, so one replica answers each). Errors stay the bus's:
BusUnavailableError when no quota service answers in time, RemoteError when it failed while answering.
"""

from __future__ import annotations

import msgspec

from bus import subjects
from bus.api import Bus
from schemas.quota_service import CheckReply, CheckRequest, CommandReply, CommandRequest, WhatIfReply, WhatIfRequest

DEFAULT_TIMEOUT_SECONDS = 15.0
"""A command may wait up to the service's command_timeout_seconds twice (its tree's last event, its own)."""


class QuotaClient:
    def __init__(self, bus: Bus, *, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self._bus = bus
        self._timeout = timeout

    async def command(self, request: CommandRequest) -> CommandReply:
        data = await self._bus.request(subjects.QUOTA_RPC_COMMAND, msgspec.json.encode(request), timeout=self._timeout)
        return msgspec.json.decode(data, type=CommandReply)

    async def check(self, request: CheckRequest) -> CheckReply:
        data = await self._bus.request(subjects.QUOTA_RPC_CHECK, msgspec.json.encode(request), timeout=self._timeout)
        return msgspec.json.decode(data, type=CheckReply)

    async def what_if(self, request: WhatIfRequest) -> WhatIfReply:
        data = await self._bus.request(subjects.QUOTA_RPC_WHAT_IF, msgspec.json.encode(request), timeout=self._timeout)
        return msgspec.json.decode(data, type=WhatIfReply)
