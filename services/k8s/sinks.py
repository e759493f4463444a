"""Where the Kubernetes bridge's writes go: the API server (`KubeSink`) or a record of them (`RecordingSink`).

services.k8s.writer decides what to write and when; a `WriteSink` carries one write out. `KubeSink` writes
idempotently: it reads the object, asks services.k8s.writes what to change, and writes nothing when nothing
changed; a write answered 409 Conflict, or 404 because the object went away, is retried at once from a fresh read,
a bounded number of times; other failures raise `WriteFailedError` for the writer to back off from; an Event that
already exists counts as written. `RecordingSink` only records what would be written (record-only mode, for
`koordbus up` without a cluster; its `export()` is for the API). Built by the composition root (koordbus).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Protocol

import aiohttp
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi

from schemas.node import MetricCollectPolicy, NodeMetricComputed
from schemas.noderesource import NodeResourceComputed
from services.k8s import core, writes

Json = dict[str, Any]

MERGE_PATCH: Final = "application/merge-patch+json"
HTTP_NOT_FOUND: Final = 404
HTTP_CONFLICT: Final = 409
HTTP_TOO_MANY_REQUESTS: Final = 429
RETRY_AT_ONCE: Final = (HTTP_CONFLICT, HTTP_NOT_FOUND)
"""Answers to a write that a fresh read resolves: the object changed (409) or went away (404) since our read."""
_NODEMETRICS: Final = (writes.NODEMETRIC_GROUP, writes.NODEMETRIC_VERSION, writes.NODEMETRIC_PLURAL)
_TOPOLOGIES: Final = (writes.TOPOLOGY_GROUP, writes.TOPOLOGY_VERSION, writes.TOPOLOGY_PLURAL)


class WriteFailedError(Exception):
    """A write that did not go through. `retry` is False when repeating it cannot help (422 Invalid, 403 …);
    `status` is the API server's answer when it gave one."""

    def __init__(self, message: str, *, retry: bool = True, status: int | None = None) -> None:
        super().__init__(message)
        self.retry = retry
        self.status = status


class WriteSink(Protocol):
    """Where the writer's intents go: the API server, or a record of what would have been written."""

    async def write_nodemetric(
        self, event: NodeMetricComputed, *, spec: MetricCollectPolicy | None = None
    ) -> writes.WriteResult:
        """Bring the node's NodeMetric status to the event's, creating the object first if missing (with `spec`, else
        the event's spec); an existing object's spec is left alone. WriteFailedError."""
        ...

    async def write_nodemetric_spec(self, node: str, spec: MetricCollectPolicy) -> writes.WriteResult:
        """Create the node's NodeMetric with `spec` (no status) if missing, else update its spec if it differs."""
        ...

    async def write_node_resources(self, decision: NodeResourceComputed) -> writes.WriteResult:
        """Bring the node's batch/mid resources and annotations to the (due) decision's; WriteFailedError."""
        ...

    async def write_event(self, event: Json) -> writes.WriteResult:
        """Create the core/v1 Event (services.k8s.writes.config_event) unless one of its name exists."""
        ...

    async def delete_nodemetric(self, node: str) -> writes.WriteResult:
        """Delete the gone node's NodeMetric; none there is no error."""
        ...

    async def write_topology_zones(self, decision: NodeResourceComputed) -> writes.WriteResult:
        """Set the decision's NUMA zone batch entries on the node's NodeResourceTopology (never creates one)."""
        ...


# --- the API server


class KubeSink:
    """Writes to the API server through kubernetes-asyncio, reading and writing raw JSON (no client models)."""

    def __init__(self, api_client: ApiClient, *, conflict_retries: int = 5, request_timeout: float = 30.0) -> None:
        self._core = CoreV1Api(api_client)
        self._custom = CustomObjectsApi(api_client)
        self._attempts = conflict_retries + 1
        self._timeout = request_timeout

    async def write_nodemetric(
        self, event: NodeMetricComputed, *, spec: MetricCollectPolicy | None = None
    ) -> writes.WriteResult:
        name = event.node
        changes: list[str] = []
        for _ in range(self._attempts):
            current = await self._get_nodemetric(name)
            if current is None:
                current = await self._create_nodemetric(name, writes.nodemetric_to_create(event, spec))
                if current is None:
                    continue
                changes.append(writes.CREATED)
            if (status_update := writes.nodemetric_status_update(current, event)) is not None:
                status, body = await self._request(
                    self._custom.replace_cluster_custom_object_status(
                        *_NODEMETRICS,
                        name,
                        status_update,
                        **self._options(),
                    )
                )
                if status in RETRY_AT_ONCE:
                    continue
                parsed(status, body, f"update NodeMetric {name} status")
                changes.append(f"status updateTime {status_update['status']['updateTime']}")
            return writes.write_result(writes.OBJECT_NODEMETRIC, name, changes)
        raise WriteFailedError(f"NodeMetric {name}: still changing under us after {self._attempts} attempts")

    async def write_nodemetric_spec(self, node: str, spec: MetricCollectPolicy) -> writes.WriteResult:
        changes: list[str] = []
        for _ in range(self._attempts):
            current = await self._get_nodemetric(node)
            if current is None:
                if await self._create_nodemetric(node, writes.nodemetric_with_spec(node, spec)) is None:
                    continue
                return writes.write_result(writes.OBJECT_NODEMETRIC, node, [writes.CREATED])
            if (spec_update := writes.nodemetric_spec_update(current, spec)) is not None:
                status, body = await self._request(
                    self._custom.replace_cluster_custom_object(*_NODEMETRICS, node, spec_update, **self._options())
                )
                if status in RETRY_AT_ONCE:
                    continue
                parsed(status, body, f"update NodeMetric {node} spec")
                changes.append("spec updated")
            return writes.write_result(writes.OBJECT_NODEMETRIC, node, changes)
        raise WriteFailedError(f"NodeMetric {node}: still changing under us after {self._attempts} attempts")

    async def _create_nodemetric(self, name: str, obj: Json) -> Json | None:
        """The created object; None when it already exists (another writer was first: read it and go on)."""
        status, body = await self._request(
            self._custom.create_cluster_custom_object(*_NODEMETRICS, obj, **self._options())
        )
        if status == HTTP_CONFLICT:
            return None
        return parsed(status, body, f"create NodeMetric {name}")

    async def delete_nodemetric(self, node: str) -> writes.WriteResult:
        status, body = await self._request(
            self._custom.delete_cluster_custom_object(*_NODEMETRICS, node, **self._options())
        )
        if status == HTTP_NOT_FOUND:
            return writes.nodemetric_deleted(node, existed=False)
        parsed(status, body, f"delete NodeMetric {node}")
        return writes.nodemetric_deleted(node, existed=True)

    async def write_event(self, event: Json) -> writes.WriteResult:
        created = await create_event(self._core, event, timeout=self._timeout)
        return writes.event_result(event, created=created)

    async def write_node_resources(self, decision: NodeResourceComputed) -> writes.WriteResult:
        name = decision.node
        if not decision.node_write_due:
            return writes.not_due(decision)
        changes: list[str] = []
        for _ in range(self._attempts):
            node = await self._get_node(name)
            if node is None:
                return writes.WriteResult(
                    object=f"{writes.OBJECT_NODE}/{name}", action="skipped", changes=("node not found",)
                )
            if (status_write := writes.node_status_patch(node, decision)) is not None:
                status, body = await self._request(
                    self._core.patch_node_status(name, status_write.patch, **self._options(content_type=MERGE_PATCH))
                )
                if status in RETRY_AT_ONCE:
                    continue
                node = parsed(status, body, f"patch node {name} status")
                changes.extend(status_write.changes)
            if (annotation_write := writes.node_annotation_patch(node, decision)) is not None:
                status, body = await self._request(
                    self._core.patch_node(name, annotation_write.patch, **self._options(content_type=MERGE_PATCH))
                )
                if status in RETRY_AT_ONCE:
                    continue
                parsed(status, body, f"patch node {name} annotations")
                changes.extend(annotation_write.changes)
            return writes.write_result(writes.OBJECT_NODE, name, changes)
        raise WriteFailedError(f"node {name}: still changing under us after {self._attempts} attempts")

    async def write_topology_zones(self, decision: NodeResourceComputed) -> writes.WriteResult:
        name = decision.node
        for _ in range(self._attempts):
            status, body = await self._request(
                self._custom.get_cluster_custom_object(*_TOPOLOGIES, name, **self._options())
            )
            if status == HTTP_NOT_FOUND:
                return writes.WriteResult(
                    object=f"{writes.OBJECT_TOPOLOGY}/{name}", action="skipped", changes=("no NodeResourceTopology",)
                )
            current = parsed(status, body, f"read NodeResourceTopology {name}")
            updated = writes.topology_with_batch_zones(current, decision.zones)
            if updated is None:
                return writes.write_result(writes.OBJECT_TOPOLOGY, name, [])
            status, body = await self._request(
                self._custom.replace_cluster_custom_object(*_TOPOLOGIES, name, updated, **self._options())
            )
            if status in RETRY_AT_ONCE:
                continue
            parsed(status, body, f"update NodeResourceTopology {name}")
            return writes.write_result(writes.OBJECT_TOPOLOGY, name, writes.topology_changes(decision.zones))
        raise WriteFailedError(f"NodeResourceTopology {name}: still changing under us after {self._attempts} attempts")

    async def _get_nodemetric(self, name: str) -> Json | None:
        status, body = await self._request(
            self._custom.get_cluster_custom_object(*_NODEMETRICS, name, **self._options())
        )
        return None if status == HTTP_NOT_FOUND else parsed(status, body, f"get NodeMetric {name}")

    async def _get_node(self, name: str) -> Json | None:
        status, body = await self._request(self._core.read_node(name, **self._options()))
        return None if status == HTTP_NOT_FOUND else parsed(status, body, f"get node {name}")

    def _options(self, *, content_type: str = "") -> dict[str, Any]:
        """Raw responses, our timeout, and for patches the media type (the client would pick a strategic merge
        patch for a dict body on core kinds, and the stubs do not declare `_content_type`)."""
        options: dict[str, Any] = {"_preload_content": False, "_request_timeout": self._timeout}
        if content_type:
            options["_content_type"] = content_type
        return options

    @staticmethod
    async def _request(call: Awaitable[object]) -> tuple[int, bytes]:
        return await raw_request(call)


async def raw_request(call: Awaitable[object]) -> tuple[int, bytes]:
    """(HTTP status, body) of one kubernetes-asyncio request made with `_preload_content=False`; connection errors
    are retryable WriteFailedErrors."""
    try:
        response = await call
        if not isinstance(response, aiohttp.ClientResponse):
            raise TypeError(f"expected a raw aiohttp response, got {type(response).__name__}")
        async with response:
            return response.status, await response.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as err:
        raise WriteFailedError(f"request failed: {type(err).__name__}: {err}") from err


async def upsert_custom_object(
    custom: CustomObjectsApi,
    resource: tuple[str, str, str],
    desired: Json,
    *,
    update: Callable[[Json, Json], Json | None],
    attempts: int,
    timeout: float,
    what: str,
) -> str:
    """Make the custom object (group, version, plural) `desired` names exist as `update(current, desired)` wants
    it: created when missing, replaced (guarded by the resourceVersion `update` keeps) when `update` returns a new
    object, left alone when it returns None. A 409 (created or changed meanwhile) or a 404 to the replace (deleted
    meanwhile) reads it again, `attempts` times; a 404 to the create (the kind is not served) raises.
    Namespaced when `desired` has a namespace, else cluster-scoped. Returns created / updated / unchanged."""
    group, version, plural = resource
    meta = desired["metadata"]
    name, namespace = meta["name"], meta.get("namespace")
    options: dict[str, Any] = {"_preload_content": False, "_request_timeout": timeout}
    scope: tuple[str, ...] = (group, version, namespace, plural) if namespace else (group, version, plural)
    # the namespaced and the cluster calls differ only in the namespace argument (the stubs type each separately)
    calls: tuple[Any, Any, Any] = (
        (custom.get_namespaced_custom_object, custom.create_namespaced_custom_object,
         custom.replace_namespaced_custom_object)
        if namespace
        else (custom.get_cluster_custom_object, custom.create_cluster_custom_object,
              custom.replace_cluster_custom_object)
    )  # fmt: skip
    get, create, replace = calls
    for _ in range(attempts):
        status, body = await raw_request(get(*scope, name, **options))
        if status == HTTP_NOT_FOUND:
            status, body = await raw_request(create(*scope, desired, **options))
            if status == HTTP_CONFLICT:
                continue  # created meanwhile: read it and compare
            parsed(status, body, f"create {what}")
            return "created"
        replacement = update(parsed(status, body, f"get {what}"), desired)
        if replacement is None:
            return "unchanged"
        status, body = await raw_request(replace(*scope, name, replacement, **options))
        if status in RETRY_AT_ONCE:  # changed or deleted since our read: read it again
            continue
        parsed(status, body, f"replace {what}")
        return "updated"
    raise WriteFailedError(f"{what}: still changing under us after {attempts} tries")


async def create_event(core_api: CoreV1Api, event: Json, *, timeout: float) -> bool:
    """Create a core/v1 Event; False when an Event of that name exists (a repeat: redelivery or restart)."""
    metadata = event["metadata"]
    body: Any = event  # raw JSON, as every call here (the stubs ask for a CoreV1Event model)
    options: dict[str, Any] = {"_preload_content": False, "_request_timeout": timeout}
    status, text = await raw_request(core_api.create_namespaced_event(metadata["namespace"], body, **options))
    if status == HTTP_CONFLICT:
        return False
    parsed(status, text, f"create Event {metadata['namespace']}/{metadata['name']}")
    return True


def parsed(status: int, body: bytes, what: str) -> Json:
    """The JSON object of a successful response; WriteFailedError (retryable for 429 and 5xx) otherwise."""
    if not 200 <= status <= 299:
        retry = status == HTTP_TOO_MANY_REQUESTS or status >= 500
        raise WriteFailedError(f"{what}: HTTP {status}: {core.error_status(body)}", retry=retry, status=status)
    try:
        return core.json_object(body)
    except ValueError as err:
        raise WriteFailedError(f"{what}: {err}") from None


# --- record-only mode


class RecordingSink:
    """Record-only mode: what would be written is kept in a services.k8s.writes.WriteRecorder, never sent."""

    def __init__(self, *, keep: int = 1000, clock: Callable[[], float] = time.time) -> None:
        self.recorder = writes.WriteRecorder(keep=keep)
        self._clock = clock

    async def write_nodemetric(
        self, event: NodeMetricComputed, *, spec: MetricCollectPolicy | None = None
    ) -> writes.WriteResult:
        return self.recorder.nodemetric(event, spec=spec, now=self._clock())

    async def write_nodemetric_spec(self, node: str, spec: MetricCollectPolicy) -> writes.WriteResult:
        return self.recorder.nodemetric_spec(node, spec, reason="colocation strategy", now=self._clock())

    async def write_event(self, event: Json) -> writes.WriteResult:
        return self.recorder.event(event, now=self._clock())

    async def delete_nodemetric(self, node: str) -> writes.WriteResult:
        return self.recorder.delete_nodemetric(node, now=self._clock())

    async def write_node_resources(self, decision: NodeResourceComputed) -> writes.WriteResult:
        return self.recorder.node_resources(decision, now=self._clock())

    async def write_topology_zones(self, decision: NodeResourceComputed) -> writes.WriteResult:
        return self.recorder.topology_zones(decision, now=self._clock())

    @property
    def log(self) -> Sequence[writes.RecordedWrite]:
        return self.recorder.log

    def export(self) -> Json:
        """For the API: the objects as they would be after the writes, and the log of writes (oldest first)."""
        return self.recorder.export()
