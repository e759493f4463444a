"""Asking the quota service: commands, admission checks and what-ifs over the bus's request/reply.

Used by the API gateway (services.quota.routes) and the admission webhook, which may run in another process than the
quota service (or several of them: the requests go to the queue group, so one replica answers each). A request
nobody received, or whose answer did not come (a replica failing over, a server's clients reconnecting, a stream
leader elected under the service's append), is sent again unchanged with backoff (bus.rpc) for `within` seconds:
checks and what-ifs only read, and a command carries its command id, by which the quota service answers a command its
log already holds with the first answer's result instead of applying it again (services.quota.service). Errors stay
the bus's: BusUnavailableError once no quota service has answered in that time (its message says why and after how
many attempts), RemoteError when it failed while answering. Retries and give-ups are counted by request and reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
from prometheus_client import CollectorRegistry, Counter

from bus import rpc, subjects
from bus.api import Bus
from bus.errors import BusUnavailableError
from schemas.quota_service import CheckReply, CheckRequest, CommandReply, CommandRequest, WhatIfReply, WhatIfRequest
from services.common.metrics import once_per_registry

DEFAULT_TIMEOUT_SECONDS = 15.0
"""One attempt's wait: a command may wait up to the service's command_timeout_seconds twice (its tree's last event,
its own)."""


@dataclass(frozen=True)
class _Instruments:
    retried: Counter
    unanswered: Counter


def _instruments(registry: CollectorRegistry) -> _Instruments:
    return _Instruments(
        retried=Counter(
            "koordbus_quota_client_retries",
            "Requests to the quota service sent again (request: command, check, what-if; reason: no responders, "
            "no answer, connection)",
            ["request", "reason"],
            registry=registry,
        ),
        unanswered=Counter(
            "koordbus_quota_client_unanswered",
            "Requests to the quota service given up unanswered, retries included (the caller got a 503)",
            ["request", "reason"],
            registry=registry,
        ),
    )


class QuotaClient:
    def __init__(
        self,
        bus: Bus,
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        within: float = rpc.REQUEST_RETRY_SECONDS,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """`timeout`: one attempt's wait; `within`: how long a request is tried, retries included (at least one
        attempt)."""
        self._bus = bus
        self._timeout = timeout
        self._within = within
        self._metrics = None if registry is None else once_per_registry(registry, "quota-client", _instruments)

    async def command(self, request: CommandRequest) -> CommandReply:
        data = await self._request("command", subjects.QUOTA_RPC_COMMAND, msgspec.json.encode(request))
        return msgspec.json.decode(data, type=CommandReply)

    async def check(self, request: CheckRequest) -> CheckReply:
        data = await self._request("check", subjects.QUOTA_RPC_CHECK, msgspec.json.encode(request))
        return msgspec.json.decode(data, type=CheckReply)

    async def what_if(self, request: WhatIfRequest) -> WhatIfReply:
        data = await self._request("what-if", subjects.QUOTA_RPC_WHAT_IF, msgspec.json.encode(request))
        return msgspec.json.decode(data, type=WhatIfReply)

    async def _request(self, kind: str, subject: str, data: bytes) -> bytes:
        metrics = self._metrics

        def retried(reason: str) -> None:
            if metrics is not None:
                metrics.retried.labels(request=kind, reason=reason).inc()

        try:
            return await rpc.request(
                self._bus,
                subject,
                data,
                attempt_timeout=self._timeout,
                within=max(self._within, self._timeout),
                handled_twice_is_safe=True,  # reads, or commands deduplicated by their id (module docstring)
                on_retry=retried,
            )
        except BusUnavailableError as e:
            if metrics is not None:
                metrics.unanswered.labels(request=kind, reason=e.reason).inc()
            raise
