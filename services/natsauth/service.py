"""The NATS auth callout service (`koordbus natsauth`): answers nats-server's authorization requests on
`$SYS.REQ.USER.AUTH` for every connection that is not a listed service user.

A request carries the client's CONNECT options; an agent sends its projected ServiceAccount token as `auth_token`.
The service asks Kubernetes about the token (a TokenReview, through `reviewer`), lets services.natsauth.core decide,
and answers with a user JWT for the agent's node (bus.auth.node_permissions: publish only `koord.v1.node.<node>.>`,
read only its own NodeSLO key) placed in the KOORD account, or with the refusal's reason, which nats-server logs
and sends the client as an authorization violation. Each answer is logged and counted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram

from bus import auth, natsjwt, nkeys
from bus.api import Bus, Responder
from services.natsauth import core
from services.natsauth.settings import NatsAuthSettings

log = logging.getLogger(__name__)

QUEUE = "koordbus-natsauth"
ANSWER_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class TokenReviewer(Protocol):
    """Asks Kubernetes about a token: the TokenReview's `status.user`, or None when it is not authenticated.
    services.k8s.token_review.KubeTokenReviewer is the real one."""

    async def review_user(self, token: str) -> Mapping[str, Any] | None: ...


class NatsAuthService:
    def __init__(
        self,
        bus: Bus,
        reviewer: TokenReviewer,
        *,
        issuer: nkeys.KeyPair,
        settings: NatsAuthSettings,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if issuer.prefix is not nkeys.Prefix.ACCOUNT:
            raise ValueError("the callout's issuer must be an account nkey (a seed starting with SA)")
        self._bus = bus
        self._reviewer = reviewer
        self._issuer = issuer
        self._settings = settings
        self._agent_user = core.service_account_user(settings.agent_service_account)
        self._clock = clock
        self._responder: Responder | None = None
        self.decisions = Counter(
            "koordbus_natsauth_decisions",
            "NATS connections the auth callout answered, by outcome and (for refusals) reason",
            ["outcome", "reason"],
            registry=registry,
        )
        self.answer_seconds = Histogram(
            "koordbus_natsauth_answer_seconds",
            "Seconds from an authorization request's arrival to its answer (the TokenReview included)",
            buckets=ANSWER_SECONDS_BUCKETS,
            registry=registry,
        )

    async def start(self) -> None:
        self._responder = await self._bus.serve(
            auth.AUTH_CALLOUT_SUBJECT, self.answer, queue=QUEUE, concurrency=self._settings.concurrency
        )
        log.info("NATS auth callout: agents of %s are let in as their node", self._agent_user)

    async def stop(self) -> None:
        if self._responder is not None:
            await self._responder.stop()
            self._responder = None

    async def answer(self, data: bytes) -> bytes:
        """The signed answer to one authorization request (empty, which the server takes as a refusal, when the
        request itself cannot be read)."""
        started = time.monotonic()
        try:
            return await self._answer(data)
        finally:
            self.answer_seconds.observe(time.monotonic() - started)

    async def _answer(self, data: bytes) -> bytes:
        try:
            request = natsjwt.parse_request(data.decode(), now=self._clock())
        except (natsjwt.JwtError, UnicodeDecodeError) as e:
            log.warning("NATS auth callout: unreadable authorization request: %s", e)
            self.decisions.labels("refused", "bad_request").inc()
            return b""
        decision: core.Decision
        try:
            reviewed = await self._reviewer.review_user(request.token) if request.token else None
            decision = core.decide(request.token, reviewed, agent_user=self._agent_user)
        except Exception as e:  # the API server did not answer: nobody is let in on a guess
            decision = core.Refused(reason=f"the TokenReview failed: {e}", kind="review_failed")
        now = self._clock()
        match decision:
            case core.Allowed(node=node, pod=pod):
                name = auth.node_user_name(node)
                user = natsjwt.user_jwt(
                    request,
                    issuer=self._issuer,
                    account=self._settings.account,
                    name=name,
                    permissions=auth.node_permissions(node),
                    now=now,
                )
                log.info("NATS auth callout: %s (pod %s, %s) connects as %s", request.client_name or "a client",
                         pod or "?", request.client_host, name)  # fmt: skip
                self.decisions.labels("allowed", "").inc()
                return natsjwt.response(request, issuer=self._issuer, user=user, now=now).encode()
            case core.Refused(reason=reason, kind=kind):
                log.warning("NATS auth callout: refused %s from %s: %s", request.client_name or "a client",
                            request.client_host, reason)  # fmt: skip
                self.decisions.labels("refused", kind).inc()
                return natsjwt.response(request, issuer=self._issuer, error=reason, now=now).encode()
