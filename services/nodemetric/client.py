"""Asking the nodemetric replica that owns a node for its prod predictor (koord.v1.rpc.nodemetric.prediction.<p>).

Used by the API gateway (services.nodemetric.routes), which may run in another process than the replicas; the
request goes to the subject of the node's partition, which only its owner serves. Errors stay the bus's:
BusUnavailableError when no replica answers in time (none owns the partition right now), RemoteError when the
replica failed or refused.
"""

from __future__ import annotations

import msgspec

from bus import subjects
from bus.api import Bus
from bus.errors import RemoteError
from schemas.prediction import PREDICTION_REPLY_DECODER, PredictionRequest, PredictionView

DEFAULT_TIMEOUT_SECONDS = 5.0


class PredictionClient:
    def __init__(self, bus: Bus, *, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self._bus = bus
        self._timeout = timeout

    async def prediction(self, node: str) -> PredictionView | None:
        """The node's predictor; None when its owner holds no models for it (no training round seen yet)."""
        request = msgspec.json.encode(PredictionRequest(node=node))
        subject = subjects.nodemetric_rpc_prediction(subjects.node_partition(node))
        data = await self._bus.request(subject, request, timeout=self._timeout)
        try:
            reply = PREDICTION_REPLY_DECODER.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as err:
            raise RemoteError(f"the nodemetric replica's answer is not a PredictionReply: {err}") from None
        if reply.error:
            raise RemoteError(f"the nodemetric replica refused the request: {reply.error}")
        return reply.view
