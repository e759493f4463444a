"""Asking the load-aware extender for one node's state over the bus's request/reply (koord.v1.rpc.loadaware.state).

Used by the API gateway (services.loadaware.routes), which runs in another process than the extender. Errors stay the
bus's: BusUnavailableError when no extender answers in time, RemoteError when it failed while answering.
"""

from __future__ import annotations

from typing import Any

import msgspec

from bus import subjects
from bus.api import Bus
from bus.errors import RemoteError
from schemas import extender as wire

DEFAULT_TIMEOUT_SECONDS = 5.0


class LoadAwareClient:
    def __init__(self, bus: Bus, *, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self._bus = bus
        self._timeout = timeout

    async def node_state(self, node: str) -> dict[str, Any] | None:
        """The node's state document (services.loadaware.snapshot.export); None when the extender does not know it."""
        request = msgspec.json.encode(wire.NodeStateRequest(node=node))
        data = await self._bus.request(subjects.LOADAWARE_RPC_STATE, request, timeout=self._timeout)
        try:
            reply = wire.NODE_STATE_REPLY.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as err:
            raise RemoteError(f"the load-aware extender's answer is not a NodeStateReply: {err}") from None
        if reply.error:
            raise RemoteError(f"the load-aware extender refused the request: {reply.error}")
        return reply.state
