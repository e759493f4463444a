"""The quota service shell: the quota event log and the cluster in, computed status out, commands and checks answered.

Consumers (durable pull, reset at start: the model lives in memory and is rebuilt every start):
  * events (KOORD_QUOTA, every event from the first): folded into services.quota.model.QuotaModel. An event that
    cannot be decoded or read is dead-lettered by the bus loop; its tree keeps its last valid state and is flagged
    (QuotaTreeComputed.problems, the koordbus_quota_unusable_events counter).
  * cluster (KOORD_CLUSTER pods and nodes, last value per subject, then new ones): pods' loads and the nodes' total.
Start-up replays the log first, then the cluster, so pods are resolved once against the whole set of quotas.
After each fetched batch (and on a tick, which also drops terminating pods past their grace period) the model is
refreshed and every quota whose status changed is published on `koord.v1.quota.status.<quota>`, every changed tree
on `koord.v1.quota.trees.<tree>` (both last-value subjects in KOORD_QUOTA_STATUS).

Requests (core NATS request/reply on `koord.v1.rpc.quota.*`, queue group "quota", so replicas share them):
  * command: decided against the model, appended to the tree's subject with `Nats-Expected-Last-Subject-Sequence`
    = the last sequence on that subject. Before deciding, the service waits until it has applied that sequence, so
    a lost race means another writer (a replica, another koordbus) appended in between: the reply is "conflict" and
    the caller retries on fresh state. The reply comes after the service applied its own event, so a read after a
    write sees it. An `expected_resource_version` adds Kubernetes-style optimistic concurrency on the object.
    A command whose id the log already holds (its caller's request timed out while it was applied, by this replica
    or another, and services.quota.client sent it again) is not decided again: the reply is the first one's, made
    from the logged events and flagged `duplicate` — so a create sent twice does not answer "already exists", nor a
    delete "not found".
  * check: the §3.8 admission check for pods in order; what-if: the computed states that would change.
Called by the CLI (`koordbus service quota`, `koordbus up`) and the integration tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import logging
import time
from collections.abc import Callable

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge

from bus import streams, subjects
from bus.api import (
    Bus,
    Consumer,
    ConsumerSpec,
    DeliverPolicy,
    Delivery,
    Handler,
    PublishOptions,
    Responder,
    msg_id,
)
from bus.errors import ConflictError, PermanentError, TemporaryError
from schemas import quota
from schemas import quota_events as ev
from schemas.cluster import CLUSTER_EVENT_DECODER, NodeObserved, PodObserved
from schemas.quota_service import (
    QUOTA_STATUS_DECODER,
    CheckReply,
    CheckRequest,
    CommandReply,
    CommandRequest,
    Outcome,
    QuotaChange,
    QuotaStatusComputed,
    QuotaTreeComputed,
    WhatIfReply,
    WhatIfRequest,
)
from services.common import observe
from services.common.projection import BatchProjector
from services.common.startup import wait_replayed
from services.common.tasks import cancel_and_wait
from services.quota import core, profiles
from services.quota.model import QuotaModel
from services.quota.settings import QuotaSettings
from services.quota.store import LoggedEvent, QuotaStore

log = logging.getLogger(__name__)

SERVICE = "quota"
EVENTS_CONSUMER = "quota-events"
CLUSTER_CONSUMER = "quota-cluster"
HISTORY_PROJECTOR = "quota-history-projector"
STATUS_PROJECTOR = "quota-status-projector"
LAST_STATUS_READER = "quota-last-status"
"""Reads the last status per subject at start-up (_read_last_statuses)."""
RPC_QUEUE = "quota"
PUBLISH_RETRY_DELAY_SECONDS = 1.0
MAX_TREE_PROBLEMS = 20
MAX_REASON_CHARS = 500

_COMMAND_DECODER = msgspec.json.Decoder(CommandRequest)
_CHECK_DECODER = msgspec.json.Decoder(CheckRequest)
_WHAT_IF_DECODER = msgspec.json.Decoder(WhatIfRequest)


class _Instruments:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.commands = Counter(
            "koordbus_quota_commands", "Quota commands answered, by outcome", ["outcome"], registry=registry
        )
        self.unusable_events = Counter(
            "koordbus_quota_unusable_events",
            "Quota events skipped because they could not be decoded, read, applied or have their statuses published "
            "(dead-lettered)",
            registry=registry,
        )
        self.status_published = Counter(
            "koordbus_quota_status_published", "Quota and tree statuses published", registry=registry
        )
        self.commands_again = Counter(
            "koordbus_quota_commands_again",
            "Quota commands received again after the log had applied them (a caller's retry after a lost reply), "
            "answered from the log",
            registry=registry,
        )
        self.checks = Counter("koordbus_quota_checks", "Pods checked by the admission check", registry=registry)
        self.verdicts = Counter(
            "koordbus_quota_check_verdicts",
            "Admission check verdicts by what decided them: fits, no-quota, parent-quota, detached, over-limit "
            "(runtime or max), over-min (non-preemptible pods), over-parent-runtime",
            ["verdict"],
            registry=registry,
        )
        self.invariants = Gauge(
            "koordbus_quota_invariant_violations",
            "Quotas breaking an invariant now (used above max, children's runtimes above their parent's)",
            registry=registry,
        )


class _EventsHandler:
    def __init__(self, owner: QuotaService) -> None:
        self._owner = owner

    async def handle(self, delivery: Delivery) -> None:
        self._owner.apply_event(delivery)

    async def flush(self) -> None:
        await self._owner.publish_changes()


class _ClusterHandler:
    def __init__(self, owner: QuotaService) -> None:
        self._owner = owner

    async def handle(self, delivery: Delivery) -> None:
        self._owner.apply_cluster(delivery.data)

    async def flush(self) -> None:
        await self._owner.publish_changes()


def _logged_event(delivery: Delivery) -> LoggedEvent:
    """A KOORD_QUOTA delivery as the history projection stores it."""
    try:
        event: ev.QuotaEvent | None = ev.decode_quota_event(delivery.data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        event = None  # kept as an "unreadable" history row; the events consumer dead-letters it
    tree = subjects.tree_of_quota_events(delivery.subject)
    return LoggedEvent(stream_seq=delivery.stream_seq, tree=tree, data=delivery.data, event=event)


class QuotaService:
    """Owns the model, the consumers, the request responders and the tick."""

    def __init__(
        self,
        bus: Bus,
        settings: QuotaSettings,
        *,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.time,
        store: QuotaStore | None = None,
    ) -> None:
        """`store` None: no projections (tests that only look at the streams)."""
        self.bus = bus
        self.store = store
        self.settings = settings
        self.model = QuotaModel(settings.model_options())
        self._clock = clock
        self._registry = registry
        self._metrics = _Instruments(registry)
        self._metrics.invariants.set_function(lambda: len(self.model.problems))
        self._command_lock = asyncio.Lock()
        """One command at a time per service: it waits for its tree's latest event, decides, appends."""
        self._publish_lock = asyncio.Lock()
        """One status publication at a time (both consumers' batches and the tick publish). Never held while
        waiting for a consumer, so a command waiting for its event cannot block the consumer that delivers it."""
        self._progress = asyncio.Event()
        """Set whenever the model sees a quota event (commands wait on it)."""
        self._consumers: list[Consumer] = []
        self._projectors: list[Consumer] = []
        self._projector_specs: list[ConsumerSpec] = []
        self._responders: list[Responder] = []
        self._ticker: asyncio.Task[None] | None = None
        self._published: dict[str, bytes] = {}
        """Quota or tree subject → the content last published (without its timestamps); read back from the stream
        at start."""
        self._last_seq: dict[str, int] = {}
        """Quota or tree subject → the stream sequence of its last status: part of the next status's msg id, so a
        status returning to an earlier value (A → B → A) is not dropped as a duplicate of the first A."""
        self._unpublished: dict[str, set[str]] = {}
        """Tree → quotas whose statuses a failed publish left out: the model's refresh reports a change once, so
        they are added to the next one's (until then the stream holds their previous status)."""
        self._ready = False
        self.profile_errors: dict[str, str] = {}
        """Profile → why its root quota could not be written (shown with the profile's tree)."""

    # --- lifecycle

    async def start(self) -> None:
        timeout = self.settings.startup_timeout_seconds
        if (store := self.store) is not None:
            history = BatchProjector(
                "quota history",
                _logged_event,
                lambda batch: store.apply_events(batch, consumer=HISTORY_PROJECTOR, stream=streams.KOORD_QUOTA),
            )
            statuses = BatchProjector(
                "quota status",
                lambda d: (d.stream_seq, QUOTA_STATUS_DECODER.decode(d.data)),
                lambda batch: store.apply_statuses(batch, consumer=STATUS_PROJECTOR, stream=streams.KOORD_QUOTA_STATUS),
            )
            projectors: tuple[tuple[str, str, tuple[str, ...], Handler], ...] = (
                (HISTORY_PROJECTOR, streams.KOORD_QUOTA, (subjects.QUOTA_EVENTS_ALL,), history),
                (
                    STATUS_PROJECTOR,
                    streams.KOORD_QUOTA_STATUS,
                    (subjects.QUOTA_STATUS_ALL, subjects.QUOTA_TREES_ALL),
                    statuses,
                ),
            )
            for name, stream, filters, handler in projectors:
                projected = await store.offset(name)
                spec = ConsumerSpec(
                    durable=self._durable(name),
                    inactive_threshold_seconds=self._inactive_threshold,
                    stream=stream,
                    filter_subjects=filters,
                    service=SERVICE,
                    batch_size=self.settings.batch_size,
                    linger_seconds=self.settings.linger_seconds,
                    # The database knows what is projected: a fresh database replays the whole stream.
                    deliver_policy="by_start_sequence",
                    opt_start_seq=projected + 1,
                    retry_flush_in_place=True,  # the store skips sequences below its offset
                )
                self._projectors.append(
                    observe.watch_consumer(self._registry, spec, self.bus.consume(spec, handler, reset=True))
                )
                self._projector_specs.append(spec)
        events = self.bus.consume(self._spec(EVENTS_CONSUMER), _EventsHandler(self), reset=True)
        self._consumers.append(events)
        if not await wait_replayed(events, what="quota: event log", stall_seconds=timeout):
            log.warning("quota: the event log replay stalled for %.0f s; starting with what was read", timeout)
        cluster = self.bus.consume(self._spec(CLUSTER_CONSUMER), _ClusterHandler(self), reset=True)
        self._consumers.append(cluster)
        if not await wait_replayed(cluster, what="quota: cluster state", stall_seconds=timeout):
            log.warning("quota: the cluster state replay stalled for %.0f s; starting with what was read", timeout)
        observe.watch_consumers(
            self._registry, service=SERVICE, consumers={EVENTS_CONSUMER: events, CLUSTER_CONSUMER: cluster}
        )
        await self._read_last_statuses(timeout)
        self._ready = True
        try:
            await self.publish_changes()
        except TemporaryError as e:  # the statuses are published again on the next batch or tick
            log.warning("quota: %s; the next tick retries", e)
        for subject, answer in (
            (subjects.QUOTA_RPC_COMMAND, self._on_command),
            (subjects.QUOTA_RPC_CHECK, self._on_check),
            (subjects.QUOTA_RPC_WHAT_IF, self._on_what_if),
        ):
            self._responders.append(await self.bus.serve(subject, answer, queue=RPC_QUEUE))
        self._ticker = asyncio.create_task(self._tick(), name="quota-tick")

    async def stop(self) -> None:
        if self._ticker is not None:
            await cancel_and_wait(self._ticker)
            self._ticker = None
        for responder in self._responders:
            await responder.stop()
        self._responders = []
        for consumer in [*self._consumers, *self._projectors]:
            await consumer.stop()
        for spec in self._projector_specs:
            observe.retire_consumer(self._registry, spec)
        self._projectors = []
        self._projector_specs = []
        if self._consumers:
            observe.retire_consumers(self._registry, service=SERVICE, names=(EVENTS_CONSUMER, CLUSTER_CONSUMER))
        self._consumers = []
        self._ready = False

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def consumers(self) -> list[Consumer]:
        """The events and cluster consumers, then the projectors when there is a store."""
        return [*self._consumers, *self._projectors]

    def _durable(self, name: str) -> str:
        return f"{name}-{self.settings.instance}" if self.settings.instance else name

    @property
    def _inactive_threshold(self) -> float | None:
        """Durables named after this replica's instance are deleted by the server an hour after it went away."""
        return 3600.0 if self.settings.instance else None

    def _spec(self, durable: str) -> ConsumerSpec:
        policy: DeliverPolicy
        filters: tuple[str, ...]
        if durable == EVENTS_CONSUMER:
            stream, filters, policy = streams.KOORD_QUOTA, (subjects.QUOTA_EVENTS_ALL,), "all"
        else:
            stream, filters, policy = (
                streams.KOORD_CLUSTER,
                (subjects.CLUSTER_NODES, subjects.CLUSTER_PODS),
                "last_per_subject",
            )
        return ConsumerSpec(
            durable=self._durable(durable),
            inactive_threshold_seconds=self._inactive_threshold,
            stream=stream,
            filter_subjects=filters,
            service=SERVICE,
            batch_size=self.settings.batch_size,
            # a command waits for its own event to come back through the events consumer (and commands go one at
            # a time): lingering there would add the linger to every command, ~10 commands/s at most
            linger_seconds=self.settings.linger_seconds if durable == CLUSTER_CONSUMER else 0.0,
            deliver_policy=policy,
        )

    async def _tick(self) -> None:
        next_profiles = 0.0
        while True:
            await asyncio.sleep(self.settings.tick_seconds)
            try:
                self.model.tick(self._clock())
                await self.publish_changes()
                if self._clock() >= next_profiles:
                    next_profiles = self._clock() + self.settings.profile_interval_seconds
                    await self.reconcile_profiles()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("quota: tick failed (the next one retries): %s", e)

    async def reconcile_profiles(self) -> None:
        """Bring every profile's root quota to what its nodes make it (services.quota.profiles), as commands."""
        for profile, root in self.model.profile_roots():
            name = profile.metadata.name
            make = ev.UpdateQuota if root.metadata.name in self.model.state.quotas else ev.CreateQuota
            digest = hashlib.blake2b(msgspec.json.encode(root), digest_size=16).hexdigest()
            command = make(command_id=msg_id("quota.profile", name, digest), quota=root)
            # not deduplicated: a root going back to an earlier value (A → B → A) has that earlier command's id
            reply = await self.execute(
                CommandRequest(actor=f"profile-controller/{name}", command=command), deduplicate=False
            )
            if reply.outcome == "applied":
                self.profile_errors.pop(name, None)
                log.info("quota: profile %s: root quota %s brought to its nodes", name, root.metadata.name)
            else:
                self.profile_errors[name] = (
                    f"profile {name}: root quota {root.metadata.name} not written: {reply.message}"
                )
                log.warning("quota: %s", self.profile_errors[name])

    # --- inputs

    def apply_event(self, delivery: Delivery) -> None:
        """Fold one logged event into the model. One that cannot be read, whose statuses could not be published, or
        that the model refuses is skipped for good (PermanentError: the bus dead-letters it), counted and shown on
        its tree: the log holds it forever, so anything else would stop every later start at the same place."""
        tree = subjects.tree_of_quota_events(delivery.subject)
        try:
            event = ev.decode_quota_event(delivery.data)
            _check_status_subjects(event)
            self.model.apply_event(event, seq=delivery.stream_seq, tree=tree)
        except Exception as e:
            self.model.note_seq(tree, delivery.stream_seq)
            reason = f"event {delivery.stream_seq} skipped: {_bounded(str(e))}"
            self.model.corrupt[tree] = reason
            self._metrics.unusable_events.inc()
            log.error("quota: tree %s: %s (the tree stays at its last valid state)", tree, reason)
            self._progress.set()
            raise PermanentError(reason) from e
        self._progress.set()

    def apply_cluster(self, data: bytes) -> None:
        match CLUSTER_EVENT_DECODER.decode(data):
            case PodObserved(namespace=namespace, name=name, pod=pod, deleted=deleted):
                self.model.set_pod(f"{namespace}/{name}", None if deleted else pod, now=self._clock())
            case NodeObserved(name=name, node=node, deleted=deleted):
                self.model.set_node(name, None if deleted else node)
            case _:
                pass

    async def _caught_up(self, seq: int) -> bool:
        """Wait until the model has seen the quota log up to sequence `seq`; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.command_timeout_seconds
        while self.model.events_seq < seq:
            self._progress.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), remaining)
        return True

    # --- publishing computed status

    async def publish_changes(self) -> None:
        if not self._ready:
            return
        async with self._publish_lock:
            changed = self.model.refresh()
            for tree, names in self._unpublished.items():
                changed.setdefault(tree, set()).update(names)
            self._unpublished = {}
            now = self._clock()
            messages: list[tuple[str, bytes, str]] = []
            published: dict[str, bytes] = {}
            for name in sorted(set().union(*changed.values())):
                self._status_message(name, now, messages, published)
            for tree in sorted({*changed, *self.model.corrupt}):  # problems only change with a tree's quotas
                self._tree_message(tree, now, messages, published)
            if not messages:
                return
            try:
                acks = await self.bus.publish_many(messages)
            except Exception as e:
                self._unpublished = changed  # published again after the next batch or tick, if still not current
                raise TemporaryError(f"publishing quota status failed: {e}", delay=PUBLISH_RETRY_DELAY_SECONDS) from e
            self._published.update(published)
            self._last_seq.update((subject, ack.seq) for (subject, _, _), ack in zip(messages, acks, strict=True))
            self._metrics.status_published.inc(len(messages))

    def _status_message(
        self, name: str, now: float, messages: list[tuple[str, bytes, str]], published: dict[str, bytes]
    ) -> None:
        subject = subjects.quota_status(name)
        tree = self.model.tree_of_quota(name)
        if tree is None:
            content = QuotaStatusComputed(
                quota=name, tree="", computed_at=0.0, events_seq=0, deleted=True, object=self.model.deleted.get(name)
            )
        else:
            content = QuotaStatusComputed(
                quota=name,
                tree=tree,
                computed_at=0.0,
                events_seq=0,
                object=self.model.state.quotas.get(name),
                state=self.model.state_of(name),
                pods=self.model.pod_count(name),
                explanation=self.model.explain(name),
                problems=self.model.problems.get(name, []),
            )
        self._queue(subject, content, now, messages, published)

    def _tree_message(
        self, tree: str, now: float, messages: list[tuple[str, bytes, str]], published: dict[str, bytes]
    ) -> None:
        runtime_tree = self.model.tree(tree)
        problems = [self.model.corrupt[tree]] if tree in self.model.corrupt else []
        problems += [
            error
            for name, error in sorted(self.profile_errors.items())
            if name in self.model.state.profiles and profiles.tree_id(self.model.state.profiles[name]) == tree
        ]
        broken = [
            p
            for name, found in sorted(self.model.problems.items())
            if self.model.tree_of_quota(name) == tree
            for p in found
        ]
        problems += broken[:MAX_TREE_PROBLEMS]
        if len(broken) > MAX_TREE_PROBLEMS:
            problems.append(f"… and {len(broken) - MAX_TREE_PROBLEMS} more (see each quota's problems)")
        content = QuotaTreeComputed(
            tree=tree,
            computed_at=0.0,
            events_seq=0,
            total=runtime_tree.total,
            quotas=len(runtime_tree.names()),
            problems=problems,
        )
        self._queue(subjects.quota_tree_status(tree), content, now, messages, published)

    def _queue(
        self,
        subject: str,
        content: QuotaStatusComputed | QuotaTreeComputed,
        now: float,
        messages: list[tuple[str, bytes, str]],
        published: dict[str, bytes],
    ) -> None:
        """Queue `content` (timestamps filled in) unless it equals what was last published on the subject."""
        key = msgspec.json.encode(content)
        if self._published.get(subject) == key:
            return
        if isinstance(content, QuotaTreeComputed):
            events_seq = self.model.tree_seq.get(content.tree, 0)
        else:
            events_seq = self.model.events_seq
        stamped = msgspec.structs.replace(content, computed_at=now, events_seq=events_seq)
        digest = hashlib.blake2b(key, digest_size=16).hexdigest()
        # the previous status's sequence makes the id unique per change, yet the same for the same change made
        # again after a restart (which reads the sequences back), so JetStream drops only true repeats
        identity = msg_id("quota.status", subject, self._last_seq.get(subject, 0), digest)
        messages.append((subject, msgspec.json.encode(stamped), identity))
        published[subject] = key

    async def _read_last_statuses(self, timeout: float) -> None:
        """The last status on each quota and tree subject, as `_queue` compares and identifies them: a restarted
        service publishes only what changed while it was away."""
        reader = _LastStatuses()
        spec = ConsumerSpec(
            durable=self._durable(LAST_STATUS_READER),
            inactive_threshold_seconds=60.0,  # read once at start: the server drops it a minute later
            stream=streams.KOORD_QUOTA_STATUS,
            filter_subjects=(subjects.QUOTA_STATUS_ALL, subjects.QUOTA_TREES_ALL),
            service=SERVICE,
            batch_size=self.settings.batch_size,
            linger_seconds=0.0,
            deliver_policy="last_per_subject",
        )
        consumer = self.bus.consume(spec, reader, reset=True)
        try:
            if not await wait_replayed(consumer, what="quota: last statuses", stall_seconds=timeout):
                log.warning("quota: reading the last statuses stalled for %.0f s; some may be published again", timeout)
        finally:
            await consumer.stop()
        for subject, (seq, key) in reader.found.items():
            self._published[subject] = key
            self._last_seq[subject] = seq

    # --- requests

    async def _on_command(self, data: bytes) -> bytes:
        reply = await self.execute(_COMMAND_DECODER.decode(data))
        self._metrics.commands.labels(outcome=reply.outcome).inc()
        return msgspec.json.encode(reply)

    async def _on_check(self, data: bytes) -> bytes:
        request = _CHECK_DECODER.decode(data)
        options = self.settings.check_options(enable_check_parent_quota=request.enable_check_parent_quota)
        verdicts = self.model.check(request.pods, options=options)  # synchronous: nothing interleaves
        self._metrics.checks.inc(len(verdicts))
        for verdict in verdicts:
            self._metrics.verdicts.labels(verdict=verdict.code).inc()
        reply = CheckReply(verdicts=[msgspec.to_builtins(v) for v in verdicts], fits=all(v.fits for v in verdicts))
        return msgspec.json.encode(reply)

    async def _on_what_if(self, data: bytes) -> bytes:
        request = _WHAT_IF_DECODER.decode(data)
        result = self.model.what_if(  # synchronous: the live trees are restored before anything else runs
            request.commands,
            [(batch.pod, batch.count, batch.assigned) for batch in request.pods],
            now=self._now(),
            actor="what-if",
        )
        notes = []
        if any(isinstance(c, ev.CreateQuota | ev.UpdateQuota) for c in request.commands) and request.pods:
            notes.append("pods already running are not re-resolved against hypothetical quotas")
        reply = WhatIfReply(
            changes=[QuotaChange(quota=name, before=was, after=after) for name, was, after in result.changes],
            violations=result.violations,
            notes=notes,
        )
        return msgspec.json.encode(reply)

    def _now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self._clock(), dt.UTC)

    async def execute(self, request: CommandRequest, *, deduplicate: bool = True) -> CommandReply:
        """Decide and append one command (see the module docstring). The service first applies everything the log
        holds, so each event's expected sequence is the last one on its tree's subject as the service saw it; a
        command the log already holds is answered from it (unless not `deduplicate`)."""
        command = request.command
        async with self._command_lock:
            tree = core.tree_of(self.model.state, command)
            _, last = await self.bus.stream_info(streams.KOORD_QUOTA)
            if not await self._caught_up(last):
                return CommandReply(
                    outcome="unavailable",
                    tree=tree,
                    message=f"the quota service has not yet applied the quota log up to event {last}; try again",
                )
            applied = self.model.applied_command(command.command_id) if deduplicate else None
            if applied is not None and not request.dry_run:
                self._metrics.commands_again.inc()
                events = list(applied.events)
                return self._reply(events, outcome="applied", tree=applied.tree, seq=applied.seq, duplicate=True)
            conflict = self._object_conflict(request)
            if conflict:
                return CommandReply(outcome="conflict", tree=tree, message=conflict)
            try:
                events = self.model.decide(command, now=self._now(), actor=request.actor)
            except core.Rejected as rejected:
                return CommandReply(
                    outcome="rejected", tree=tree, violations=rejected.violations, message=str(rejected)
                )
            if request.dry_run or not events:
                return self._reply(events, outcome="valid" if request.dry_run else "applied", tree=tree)
            seq, duplicate = 0, False
            for position, event in enumerate(events):
                tree = core.event_tree(event)
                try:
                    ack = await self.bus.publish(
                        subjects.quota_events(tree),
                        ev.encode_quota_event(event),
                        msg_id=msg_id("quota.command", command.command_id, position),
                        options=PublishOptions(expected_last_subject_seq=self.model.tree_seq.get(tree, 0)),
                    )
                except ConflictError:
                    done = f" ({position} of {len(events)} events were appended)" if position else ""
                    return CommandReply(
                        outcome="conflict",
                        tree=tree,
                        message=f"tree {tree} changed while this command was decided (another writer won the "
                        f"race){done}; read it again and retry",
                    )
                seq, duplicate = ack.seq, duplicate or ack.duplicate
                await self._caught_up(seq)
            return self._reply(events, outcome="applied", tree=tree, seq=seq, duplicate=duplicate)

    def _object_conflict(self, request: CommandRequest) -> str:
        wanted = request.expected_resource_version
        if not wanted:
            return ""
        command = request.command
        match command:
            case ev.CreateQuota() | ev.CreateProfile():
                return ""
            case ev.UpdateQuota(quota=obj):
                name, current = obj.metadata.name, self.model.state.quotas.get(obj.metadata.name)
            case ev.PatchQuota(name=name) | ev.DeleteQuota(name=name):
                current = self.model.state.quotas.get(name)
            case ev.AttachNamespaces(name=name) | ev.DetachNamespaces(name=name):
                current = self.model.state.quotas.get(name)
            case ev.UpdateProfile(profile=p):
                name = p.metadata.name
                held = self.model.state.profiles.get(name)
                version = "" if held is None else held.metadata.resource_version
                return _version_conflict(f"profile {name}", version, wanted)
            case ev.DeleteProfile(name=name):
                held = self.model.state.profiles.get(name)
                version = "" if held is None else held.metadata.resource_version
                return _version_conflict(f"profile {name}", version, wanted)
        version = "" if current is None else current.metadata.resource_version
        return _version_conflict(f"quota {name}", version, wanted)

    def _reply(
        self, events: list[ev.QuotaEvent], *, outcome: Outcome, tree: str, seq: int = 0, duplicate: bool = False
    ) -> CommandReply:
        """The reply to a decided command: the objects as they are now (after its events) or would be (dry run)."""
        reply = CommandReply(outcome=outcome, tree=tree, seq=seq, duplicate=duplicate)
        quotas: list[quota.ElasticQuota] = []
        for event in events:
            match event:
                case ev.QuotaCreated(quota=obj) | ev.QuotaUpdated(quota=obj):
                    quotas.append(self.model.state.quotas.get(obj.metadata.name, obj) if seq else obj)
                case ev.QuotaDeleted(quota=obj):
                    quotas.append(obj)
                case ev.QuotasImported(quotas=objs):
                    quotas.extend(self.model.state.quotas.get(o.metadata.name, o) if seq else o for o in objs)
                case ev.ProfileCreated(profile=p) | ev.ProfileUpdated(profile=p) | ev.ProfileDeleted(profile=p):
                    profile = self.model.state.profiles.get(p.metadata.name, p) if seq else p
                    reply = msgspec.structs.replace(reply, profile=profile)
        if quotas:
            reply = msgspec.structs.replace(reply, quota=quotas[-1], quotas=quotas)
        return reply


def _check_status_subjects(event: ev.QuotaEvent) -> None:
    """SubjectError when a quota or tree the event names could not be the subject of its status (a name too long for
    nats-server, which would drop the connection of every service of the process)."""
    names: list[str] = []
    trees = [core.event_tree(event)]
    match event:
        case ev.QuotaCreated(quota=obj) | ev.QuotaUpdated(quota=obj) | ev.QuotaDeleted(quota=obj):
            names.append(obj.metadata.name)
        case ev.QuotasImported(quotas=objs):
            names.extend(o.metadata.name for o in objs)
            trees.extend(core.quota_tree(o) for o in objs)
        case ev.ProfileCreated(profile=p) | ev.ProfileUpdated(profile=p) | ev.ProfileDeleted(profile=p):
            names.append(p.spec.quota_name)
    for what, name, subject in [
        *(("quota", name, subjects.quota_status) for name in names),
        *(("tree", tree, subjects.quota_tree_status) for tree in trees),
    ]:
        try:
            subjects.check_publishable(subject(name))
        except subjects.SubjectError as e:
            shown = name if len(name) <= 60 else f"{name[:60]}… ({len(name)} characters)"
            raise subjects.SubjectError(f"{what} {shown} cannot have a status: {e}") from e


def _bounded(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """A reason shown on a tree and logged: a hostile name in it must not make either huge."""
    return text if len(text) <= limit else f"{text[: limit - 1]}… ({len(text)} characters)"


def _version_conflict(what: str, current: str, wanted: str) -> str:
    if current == wanted:
        return ""
    return (
        f"{what} has resourceVersion {current or '(none: it does not exist)'}, not {wanted}: it changed since it "
        "was read; read it again and retry"
    )


class _LastStatuses:
    """Collects each subject's last status (stream sequence, content without its timestamps) at start-up."""

    def __init__(self) -> None:
        self.found: dict[str, tuple[int, bytes]] = {}

    async def handle(self, delivery: Delivery) -> None:
        try:
            event = QUOTA_STATUS_DECODER.decode(delivery.data)
        except msgspec.ValidationError as e:  # not ours to judge here: the next status replaces it
            log.warning("quota: unreadable status on %s: %s", delivery.subject, e)
            return
        content = msgspec.structs.replace(event, computed_at=0.0, events_seq=0)
        self.found[delivery.subject] = (delivery.stream_seq, msgspec.json.encode(content))

    async def flush(self) -> None:
        return None
