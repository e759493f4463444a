"""The webhook service shell: the bridge's ClusterColocationProfiles, Namespaces and PriorityClasses and the REST API's
profiles in, AdmissionReview answers out.

One durable consumer on KOORD_CLUSTER (the three subject families, last value per subject, reset at every start: the
view lives in memory and is rebuilt, like services.loadaware) and one on KOORD_CCP (the profiles koordbus holds,
written through the REST API: services.webhook.routes) fold services.webhook.state.AdmissionView; `start` returns once
both replays are done, so the composition root opens the HTTPS port only when a Pod would see every profile. The
admission routes are a table (`routes`: path → handler of an AdmissionRequest), answered by `answer` on the event loop
between deliveries, so each answer reads one consistent view: POST /mutate-pods
(services.webhook.admission.mutate_pod) and POST /validate-configmaps (validate_configmap, with the validators the
composition root hands in); a webhook that asks another service is one more entry, given to the constructor as
`extra_routes`: POST /validate-elasticquotas is `QuotaValidation` below, asking the quota service through the client
the composition root hands it. Each request is counted and timed by route and outcome
(koordbus_webhook_requests_total, koordbus_webhook_request_seconds) and every refusal logged with its reason. Built by
koordbus.webhook (`koordbus service webhook`) and the tests.
"""

from __future__ import annotations

import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from bus import streams, subjects
from bus.api import Bus, Consumer, ConsumerSpec, Delivery
from bus.errors import BusUnavailableError, PayloadTooLargeError, RemoteError
from schemas.cluster import ADMISSION_EVENT_DECODER
from schemas.colocation_events import PROFILE_EVENT_DECODER
from schemas.quota_service import CommandReply, CommandRequest
from services.common import bodies, observe
from services.common.startup import wait_replayed
from services.webhook import admission, configmap, elasticquota
from services.webhook.admission import AdmissionRequest, AdmissionResponse, BadReview
from services.webhook.settings import WebhookSettings
from services.webhook.state import AdmissionView

log = logging.getLogger(__name__)

SERVICE: Final = "webhook"
CLUSTER_CONSUMER: Final = "webhook-cluster"
PROFILES_CONSUMER: Final = "webhook-profiles"
MUTATE_PODS: Final = "/mutate-pods"
VALIDATE_CONFIGMAPS: Final = "/validate-configmaps"
VALIDATE_ELASTICQUOTAS: Final = "/validate-elasticquotas"
QUOTA_CONFLICT_ATTEMPTS: Final = 3
"""A command that lost the race on its tree (another writer appended in between) is asked again on fresh state, at
most this many times in all: the user's change is a patch, as valid over the newer state as over the older."""
INSTANCE_DURABLE_TTL_SECONDS: Final = 3600.0
"""A replica's durable (named after its pod) is dropped by the server this long after the replica went away."""

Handler = Callable[[AdmissionRequest], AdmissionResponse | Awaitable[AdmissionResponse]]
"""An admission route's decision: the request → the response (or an awaitable of it, for a handler that asks
another service)."""


class _Instruments:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "koordbus_webhook_requests_total",
            "AdmissionReviews answered, by route and outcome: allowed (unchanged), patched (allowed with a JSON "
            "patch), refused (allowed: false), bad_request (HTTP 400: not an AdmissionReview v1)",
            ["route", "outcome"],
            registry=registry,
        )
        self.seconds = Histogram(
            "koordbus_webhook_request_seconds",
            "Time to answer an AdmissionReview (decode, decide, encode), by route",
            ["route"],
            registry=registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )
        self.objects = Gauge(
            "koordbus_webhook_objects",
            "Objects in the webhook's view, by kind: clustercolocationprofile (the profiles that apply), of them "
            "clustercolocationprofile-koordbus (the REST API's), clustercolocationprofile-shadowed (the cluster's "
            "that do not apply: the REST API holds one of the same name), namespace, priorityclass",
            ["kind"],
            registry=registry,
        )


class _Handler:
    def __init__(self, owner: WebhookService, *, profiles: bool = False) -> None:
        self._owner = owner
        self._profiles = profiles

    async def handle(self, delivery: Delivery) -> None:
        if self._profiles:
            self._owner.apply_profile(delivery.data)
        else:
            self._owner.apply(delivery.data)

    async def flush(self) -> None:
        self._owner.refresh_gauges()


class WebhookService:
    def __init__(
        self,
        bus: Bus,
        settings: WebhookSettings,
        *,
        registry: CollectorRegistry,
        validators: Mapping[str, configmap.KeyValidator] = configmap.COMMON_VALIDATORS,
        extra_routes: Mapping[str, Handler] | None = None,
        draw: Callable[[], int] | None = None,
    ) -> None:
        """`validators`: the slo-controller-config keys checked and how (koordbus.webhook gives every service's);
        `draw`: a profile's probability draw in 0–99 (default: random, as Koordinator's rand.Intn(100))."""
        self.bus = bus
        self.settings = settings
        self.view = AdmissionView()
        self.replayed = False
        self._validators = validators
        self._draw = draw or _random_draw()
        self._registry = registry
        self._metrics = _Instruments(registry)
        self._consumer: Consumer | None = None
        self._profiles_consumer: Consumer | None = None
        self.routes: dict[str, Handler] = {
            MUTATE_PODS: self.mutate_pods,
            VALIDATE_CONFIGMAPS: self.validate_configmaps,
            **(extra_routes or {}),
        }
        """Path → handler: every admission route the HTTPS server serves."""

    async def start(self) -> None:
        instance = self.settings.instance
        ttl = INSTANCE_DURABLE_TTL_SECONDS if instance else None
        spec = ConsumerSpec(
            durable=f"{CLUSTER_CONSUMER}-{instance}" if instance else CLUSTER_CONSUMER,
            stream=streams.KOORD_CLUSTER,
            filter_subjects=(subjects.CLUSTER_PROFILES, subjects.CLUSTER_NAMESPACES, subjects.CLUSTER_PRIORITY_CLASSES),
            service=SERVICE,
            deliver_policy="last_per_subject",
            batch_size=512,
            inactive_threshold_seconds=ttl,
        )
        owned = ConsumerSpec(
            durable=f"{PROFILES_CONSUMER}-{instance}" if instance else PROFILES_CONSUMER,
            stream=streams.KOORD_CCP,
            filter_subjects=(subjects.PROFILES_ALL,),
            service=SERVICE,
            deliver_policy="last_per_subject",
            batch_size=512,
            inactive_threshold_seconds=ttl,
        )
        self._consumer = self.bus.consume(spec, _Handler(self), reset=True)
        self._profiles_consumer = self.bus.consume(owned, _Handler(self, profiles=True), reset=True)
        observe.watch_consumers(
            self._registry,
            service=SERVICE,
            consumers={CLUSTER_CONSUMER: self._consumer, PROFILES_CONSUMER: self._profiles_consumer},
        )
        timeout = self.settings.startup_timeout_seconds
        for consumer, what in ((self._consumer, "cluster"), (self._profiles_consumer, "profiles")):
            if not await wait_replayed(consumer, what=f"webhook: {what}", stall_seconds=timeout):
                log.warning("webhook: the %s replay stalled for %.0f s; serving with what was read", what, timeout)
        self.replayed = True
        self.refresh_gauges()
        counts = self.view.counts()
        log.info(
            "webhook: serving with %d ClusterColocationProfiles (%d from koordbus's REST API), %d Namespaces, "
            "%d PriorityClasses",
            counts["clustercolocationprofile"],
            counts["clustercolocationprofile-koordbus"],
            counts["namespace"],
            counts["priorityclass"],
        )
        shadowed = self.view.shadowed()
        if shadowed:
            log.info(
                "webhook: the cluster's ClusterColocationProfiles %s do not apply: koordbus's REST API holds profiles "
                "of the same names, which do",
                ", ".join(shadowed[:20]) + (f" and {len(shadowed) - 20} more" if len(shadowed) > 20 else ""),
            )

    async def stop(self) -> None:
        consumers = (self._consumer, self._profiles_consumer)
        self._consumer = self._profiles_consumer = None
        for consumer in consumers:
            if consumer is not None:
                await consumer.stop()
        if any(consumers):
            observe.retire_consumers(self._registry, service=SERVICE, names=(CLUSTER_CONSUMER, PROFILES_CONSUMER))

    @property
    def consumer(self) -> Consumer | None:
        return self._consumer

    def apply(self, data: bytes) -> None:
        self.view.apply(ADMISSION_EVENT_DECODER.decode(data))

    def apply_profile(self, data: bytes) -> None:
        """One event of the profile log (KOORD_CCP)."""
        self.view.apply(PROFILE_EVENT_DECODER.decode(data))

    def refresh_gauges(self) -> None:
        for kind, count in self.view.counts().items():
            self._metrics.objects.labels(kind).set(count)

    # --- the admission handlers

    def mutate_pods(self, request: AdmissionRequest) -> AdmissionResponse:
        return admission.mutate_pod(
            request, self.view, skip_mutating_resources=self.settings.skip_mutating_resources, draw=self._draw
        )

    def validate_configmaps(self, request: AdmissionRequest) -> AdmissionResponse:
        target = (self.settings.configmap_namespace, self.settings.configmap_name)
        return admission.validate_configmap(request, target=target, validators=self._validators)

    async def answer(self, route: str, body: bytes) -> bytes:
        """The AdmissionReview answering `body` on `route` (one of `routes`); BadReview (an HTTP 400) when the body
        is not an AdmissionReview v1."""
        started = time.perf_counter()
        try:
            request = admission.review_request(bodies.decode_json(body))
        except (bodies.BodyError, BadReview) as err:
            self._metrics.requests.labels(route, "bad_request").inc()
            log.info("webhook %s: not an AdmissionReview v1: %s", route, err)
            raise BadReview(str(err)) from None
        decided = self.routes[route](request)
        response = await decided if inspect.isawaitable(decided) else decided
        encoded = admission.encode_review(response)
        outcome = "patched" if response.patch else "allowed" if response.allowed else "refused"
        self._metrics.requests.labels(route, outcome).inc()
        self._metrics.seconds.labels(route).observe(time.perf_counter() - started)
        if not response.allowed:
            shown = f"{request.namespace}/{request.name}" if request.namespace else request.name or "(unnamed)"
            message = response.status.message if response.status else ""
            log.info(
                "webhook %s: refused %s %s %s (uid %s): %s",
                route,
                request.operation,
                request.kind.kind,
                shown,
                request.uid,
                message,
            )
        return encoded


def _random_draw() -> Callable[[], int]:
    generator = random.Random()

    def draw() -> int:
        return generator.randrange(100)

    return draw


class QuotaValidation:
    """The handler of POST /validate-elasticquotas: an ElasticQuota change made in the cluster checked by the quota
    service and, when allowed, appended to its tree's log as the command of the user who made it
    (services.webhook.elasticquota decides what to ask and what the answer means; this half asks).

    `ask` sends one command to the quota service (the composition root gives services.quota's QuotaClient, with a
    timeout below the webhook configuration's timeoutSeconds). When it does not answer (no responder, a timeout,
    the bus away) the change is refused with code 503 and the reason; a lost race is asked again, up to
    QUOTA_CONFLICT_ATTEMPTS times. Each review is counted by decision (koordbus_webhook_quota_decisions_total);
    each refusal is logged (by WebhookService.answer), each appended command at DEBUG (the log holds its user)."""

    def __init__(
        self,
        ask: Callable[[CommandRequest], Awaitable[CommandReply]],
        *,
        mirror_users: Iterable[str],
        registry: CollectorRegistry,
    ) -> None:
        self._ask = ask
        self._mirror_users = frozenset(user for user in mirror_users if user)
        self._decisions = Counter(
            "koordbus_webhook_quota_decisions_total",
            "ElasticQuota reviews by decision: recorded (a command appended), validated (dry run), mirror (the "
            "mirror's own write, passed), unchanged (nothing the log holds changed), unmanaged (not in the log), "
            "refused (rules broken, a lost race), unavailable (the quota service did not decide), invalid (not an "
            "ElasticQuota), ignored (another resource or a subresource)",
            ["decision"],
            registry=registry,
        )

    async def __call__(self, request: AdmissionRequest) -> AdmissionResponse:
        planned = elasticquota.plan(request, mirror_users=self._mirror_users)
        if isinstance(planned, elasticquota.Answer):
            self._decisions.labels(planned.decision).inc()
            return planned.response
        answered = await self._decide(request, planned)
        self._decisions.labels(answered.decision).inc()
        command = planned.request.command
        if answered.decision == "recorded":  # the quota log itself records who changed what: DEBUG is enough here
            log.debug(
                "webhook: %s %s by %s recorded as %s (uid %s)",
                request.operation,
                planned.shown,
                request.user_info.username,
                type(command).__name__,
                request.uid,
            )
        elif answered.decision == "unmanaged":
            log.info("webhook: %s %s: not in the quota log, let through", request.operation, planned.shown)
        return answered.response

    async def _decide(self, request: AdmissionRequest, planned: elasticquota.Ask) -> elasticquota.Answer:
        for _ in range(QUOTA_CONFLICT_ATTEMPTS):
            try:
                reply = await self._ask(planned.request)
            except BusUnavailableError as err:
                return elasticquota.unavailable(request, planned, str(err))
            except PayloadTooLargeError as err:
                return elasticquota.failed(request, planned, code=413, why=str(err))
            except RemoteError as err:
                return elasticquota.failed(request, planned, code=500, why=str(err))
            if reply.outcome != "conflict":
                break
        return elasticquota.answer(request, planned, reply)
