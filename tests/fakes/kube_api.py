"""An in-memory Kubernetes API server spoken to over real HTTP, for tests that drive kubernetes-asyncio.

`FakeKubeApi` serves the real server's REST paths on 127.0.0.1 (`/api/v1/...`,
`/apis/<group>/<version>/...`, namespaced and all-namespaces collections, `/status`) for the kinds
in `resource_kinds()`, with the semantics services/k8s relies on: one global resourceVersion
counter bumped on every write, 409 on stale writes, merge / strategic-merge / JSON patches, status
subresource rules, watches that resume from a resourceVersion and get a 410 ERROR event once it left
the retained window, and validation against the CRD schemas in ../shared/reference/koordinator-crds.
Tests get one from tests/fixtures/kube.py and inspect or steer it through its hooks (`objects`,
`get`, `put`, `remove`, `requests`, `bodies`, `fail_next`, `degrade`, `drop_watches`, `expire_history`, `bookmark`;
`answered` lists every request with its time and status, for tests counting attempts). The pure
rules (kinds, validation, patches, selectors) live in tests/fakes/kube_rules.py.

Validating admission, when a test sets `admission`: every create, update, patch and delete of an object (not of a
subresource) is handed to it after the schema validation and before it is stored, as kube-apiserver calls
validating webhooks (`AdmissionAttributes`: the operation, the object and the old one, the user the request's bearer
token names in `tokens`, else system:anonymous); raising ApiError refuses the write with that status.
tests/support/webhook.py makes one that calls the real webhook process over HTTPS. The write stored is the one
admitted: an update or patch whose object another write changed while admission ran is tried again from the new
state, admission included (a resourceVersion precondition then fails with 409), as the real server's
GuaranteedUpdate does; a delete then fails with 409.

Deliberate differences from a real server, to keep it small and our writers honest: fields a CRD
schema does not declare are rejected with 422 instead of pruned; no finalizers, pagination
(`limit` is ignored and every item returned), delete options (only preconditions.uid is honoured,
on a DELETE or an eviction; all are kept in `bodies`), deletecollection, mutating admission, dry runs,
server-side apply or managedFields; `/status` writes change only `.status` (the real server also
takes label changes there for core kinds); list ignores `resourceVersion` and serves the latest state.
ARCHITECTURE.md suggests extending kmock's KubernetesEmulator; kmock is not a dependency, so this is
standalone.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from aiohttp import web
from kubernetes_asyncio.client import Configuration

from tests.fakes.kube_rules import (
    ApiError,
    Json,
    Requirement,
    ResourceKind,
    invalid,
    json_patch,
    merge_patch,
    parse_selector,
    resource_kinds,
    validation_errors,
)


class RecordedRequest(NamedTuple):
    """One request as the server saw it: a Kubernetes verb (get, list, watch, create, update, patch,
    delete), the URL path without query, and the request's media type ("" when none was sent)."""

    verb: str
    path: str
    content_type: str


class SentBody(NamedTuple):
    """The JSON body of a write as the server received it (None: no body, or not JSON), for tests asserting what
    was asked (an Eviction's or a DELETE's deleteOptions, a patch)."""

    verb: str
    path: str
    body: Any


def _parsed(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


class AdmissionAttributes(NamedTuple):
    """A write as validating admission sees it (kube-apiserver's AdmissionRequest, in short)."""

    operation: str  # CREATE, UPDATE, DELETE
    kind: ResourceKind
    namespace: str
    name: str
    object: Json | None
    old_object: Json | None
    username: str
    groups: tuple[str, ...]


ANONYMOUS = ("system:anonymous", ("system:unauthenticated",))
UPDATE_ATTEMPTS = 5
"""An update or patch whose object changed while admission ran is tried this many times from the new state."""


class AnsweredRequest(NamedTuple):
    """A resource request and how it was answered: `at` is time.monotonic() when it arrived."""

    at: float
    verb: str
    path: str
    status: int


@dataclass(frozen=True)
class Degradation:
    """A slow or failing API server on the paths that start with `path_prefix` ("" = every path): each request
    waits `latency_seconds`, then fails with `status` with probability `failure_ratio` (0 … 1, from the server's
    seeded random generator, so a run is repeatable), else is served."""

    path_prefix: str
    latency_seconds: float = 0.0
    failure_ratio: float = 0.0
    status: int = 500


@dataclass
class _Change:
    resource_version: int
    kind: ResourceKind
    type: str  # ADDED, MODIFIED, DELETED
    obj: Json
    old: Json | None


@dataclass(eq=False)
class _Watch:
    kind: ResourceKind
    namespace: str | None
    selector: list[Requirement]
    bookmarks: bool
    queue: asyncio.Queue[Json | str] = field(default_factory=asyncio.Queue)

    def event(self, change: _Change) -> Json | None:
        """The event this watcher sees, as the real server filters: leaving the selection is a DELETED."""
        if change.kind != self.kind:
            return None
        now, before = self._selects(change.obj), change.old is not None and self._selects(change.old)
        seen_as = {(True, True): change.type, (True, False): "ADDED", (False, True): "DELETED"}.get((now, before))
        if change.type == "DELETED":
            seen_as = "DELETED" if now else None
        return {"type": seen_as, "object": change.obj} if seen_as else None

    def _selects(self, obj: Json) -> bool:
        if self.namespace is not None and obj["metadata"].get("namespace") != self.namespace:
            return False
        return all(r.matches(obj) for r in self.selector)


_END, _ABORT = "end", "abort"  # queue signals: finish the stream cleanly / cut the connection


def _flag(query: Any, name: str) -> bool:
    """A boolean query parameter as Go's strconv.ParseBool reads it (kubernetes-asyncio sends `True`)."""
    return query.get(name) in ("1", "t", "T", "true", "True", "TRUE")


@dataclass
class _Fault:
    verb: str
    plural: str
    status: int
    times: int


class FakeKubeApi:
    """An in-memory API server on a free 127.0.0.1 port; use `async with FakeKubeApi() as api`."""

    def __init__(
        self, *, history_limit: int = 1000, clock: Callable[[], datetime] | None = None, seed: int = 0
    ) -> None:
        self.kinds = resource_kinds()
        self.url = ""
        self.requests: list[RecordedRequest] = []
        self.bodies: list[SentBody] = []
        """Every write's body, in arrival order (evictions, deletes, patches, creates, updates)."""
        self._store: dict[str, dict[tuple[str, str], Json]] = {k.plural: {} for k in self.kinds}
        self._resource_version = 0
        self._history: deque[_Change] = deque()
        self._history_limit = history_limit
        self._oldest_resumable = 0  # a watch may resume from this resourceVersion or later
        self._watches: set[_Watch] = set()
        self._faults: list[_Fault] = []
        self._degradations: list[Degradation] = []
        self.answered: list[AnsweredRequest] = []
        self._clock = clock or (lambda: datetime.now(UTC))
        self._random = random.Random(seed)
        self._fault_random = random.Random(seed)  # its own, so faults leave generated uids and names as they were
        self._runner: web.AppRunner | None = None
        self.tokens: dict[str, tuple[str, list[str]]] = {}
        """Bearer tokens a TokenReview authenticates: token → (username, groups)."""
        self.token_extra: dict[str, dict[str, list[str]]] = {}
        """The user extra a TokenReview returns with a token (a pod-bound ServiceAccount token's
        `authentication.kubernetes.io/node-name`, pod-name …)."""
        self.token_audiences: dict[str, list[str]] = {}
        """The audiences a token was issued for; a review asking for others does not authenticate it. Absent: the
        API server's default audience (a review naming any audience does not authenticate it)."""
        self.eviction_blocked: set[tuple[str, str]] = set()
        """(namespace, pod) pairs whose eviction is refused with 429, as a PodDisruptionBudget would."""
        self.on_evicted: Callable[[Json], None] | None = None
        """Called with each evicted pod right after its deletion (a test playing a controller that replaces it)."""
        self.admission: Callable[[AdmissionAttributes], Awaitable[None]] | None = None
        """Validating admission (see the module docstring): raise ApiError to refuse the write."""
        self._closing = False

    # lifecycle

    async def start(self) -> FakeKubeApi:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        # handler_cancellation: a watch whose client went away ends at once instead of at its next event
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        self._closing = True
        self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeKubeApi:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def configuration(self) -> Configuration:
        """A kubernetes-asyncio client configuration pointing at this server, without auth."""
        return Configuration(host=self.url)

    def kubeconfig(self, path: Path) -> Path:
        """Write a kubeconfig whose current context is this server (no auth) and return its path."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        }
        path.write_text(yaml.safe_dump(config))
        return path

    # test hooks

    def resource_kind(self, name: str) -> ResourceKind:
        """A served kind by plural (`nodemetrics`) or kind name (`NodeMetric`)."""
        for kind in self.kinds:
            if name in (kind.plural, kind.kind):
                return kind
        raise KeyError(f"the fake API server does not serve {name!r}")

    def objects(self, kind: str) -> list[Json]:
        """Copies of every stored object of a kind, ordered by namespace and name."""
        store = self._store[self.resource_kind(kind).plural]
        return [copy.deepcopy(store[key]) for key in sorted(store)]

    def get(self, kind: str, name: str, namespace: str | None = None) -> Json | None:
        found = self._store[self.resource_kind(kind).plural].get((namespace or "", name))
        return copy.deepcopy(found) if found is not None else None

    def put(self, kind: str, obj: Json) -> Json:
        """Store an object as given (no validation, status kept), as if another client wrote it; emits
        ADDED or MODIFIED to watches. Namespaced kinds default to namespace `default`."""
        resource = self.resource_kind(kind)
        obj = copy.deepcopy(obj)
        obj.setdefault("apiVersion", resource.api_version)
        obj.setdefault("kind", resource.kind)
        meta = obj.setdefault("metadata", {})
        if resource.namespaced:
            meta.setdefault("namespace", "default")
        key = (meta.get("namespace", ""), meta["name"])
        old = self._store[resource.plural].get(key)
        if old is None:
            self._stamp_new(meta)
        else:
            meta.update({k: old["metadata"][k] for k in ("uid", "creationTimestamp") if k in old["metadata"]})
        return self._commit(resource, obj, "ADDED" if old is None else "MODIFIED", old)

    def remove(self, kind: str, name: str, namespace: str | None = None) -> None:
        """Delete an object as if another client did; emits DELETED to watches."""
        resource = self.resource_kind(kind)
        current = self._require(resource, namespace or "", name)
        self._commit(resource, copy.deepcopy(current), "DELETED", current)

    def fail_next(self, verb: str, kind: str, *, status: int = 500, times: int = 1) -> None:
        """Answer the next `times` requests of `verb` (get, list, watch, create, update, patch,
        delete; main resource or /status) on `kind` with an error Status of this code."""
        self._faults.append(_Fault(verb, self.resource_kind(kind).plural, status, times))

    def degrade(
        self, path_prefix: str = "", *, latency_seconds: float = 0.0, failure_ratio: float = 0.0, status: int = 500
    ) -> None:
        """Make requests under `path_prefix` slow and/or failing (see Degradation) until `recover()`; off by default.
        The first degradation whose prefix matches a request applies."""
        if not 0.0 <= failure_ratio <= 1.0 or latency_seconds < 0:
            raise ValueError("failure_ratio must be within 0 … 1 and latency_seconds not negative")
        self._degradations.append(Degradation(path_prefix, latency_seconds, failure_ratio, status))

    def recover(self) -> None:
        """Every degradation off: requests are served at once again."""
        self._degradations.clear()

    def open_watches(self, kind: str) -> int:
        """How many watch streams on `kind` are open now (a test waits for them before dropping watches)."""
        plural = self.resource_kind(kind).plural
        return sum(1 for watch in self._watches if watch.kind.plural == plural)

    def drop_watches(self, *, abrupt: bool = False) -> None:
        """End every open watch stream, cleanly (like a server timeout) or by cutting the connection."""
        for watch in self._watches:
            watch.queue.put_nowait(_ABORT if abrupt else _END)

    def expire_history(self) -> None:
        """Forget every change so far: watches resuming from an older resourceVersion get 410 Expired."""
        self._history.clear()
        self._oldest_resumable = self._resource_version

    def bookmark(self) -> None:
        """Send a BOOKMARK at the current resourceVersion to watches that allowed bookmarks."""
        for watch in self._watches:
            if watch.bookmarks:
                meta = {"resourceVersion": str(self._resource_version)}
                obj = {"kind": watch.kind.kind, "apiVersion": watch.kind.api_version, "metadata": meta}
                watch.queue.put_nowait({"type": "BOOKMARK", "object": obj})

    # storage

    def _stamp_new(self, meta: Json) -> None:
        meta.setdefault("uid", str(uuid.UUID(int=self._random.getrandbits(128), version=4)))
        meta.setdefault("creationTimestamp", self._clock().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))

    def _require(self, kind: ResourceKind, namespace: str, name: str) -> Json:
        found = self._store[kind.plural].get((namespace, name))
        if found is None:
            raise ApiError(
                404,
                f'{kind.resource} "{name}" not found',
                details={"name": name, "group": kind.group, "kind": kind.plural},
            )
        return found

    def _commit(self, kind: ResourceKind, obj: Json, change_type: str, old: Json | None) -> Json:
        """The one write path: bump the global resourceVersion, store, record history, notify watches."""
        self._resource_version += 1
        obj["metadata"]["resourceVersion"] = str(self._resource_version)
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if change_type == "DELETED":
            del self._store[kind.plural][key]
        else:
            self._store[kind.plural][key] = obj
        change = _Change(self._resource_version, kind, change_type, copy.deepcopy(obj), copy.deepcopy(old))
        self._history.append(change)
        while len(self._history) > self._history_limit:
            self._oldest_resumable = self._history.popleft().resource_version
        for watch in self._watches:
            if (event := watch.event(change)) is not None:
                watch.queue.put_nowait(event)
        return copy.deepcopy(obj)

    def _written(self, kind: ResourceKind, current: Json, new: Json) -> Json:
        """`new` as it replaces `current`: server-owned metadata kept, generation bumped on a spec change, checked
        against the schema (equal to `current` for a no-op write, which the real server does not store)."""
        meta = new.setdefault("metadata", {})
        for key in ("name", "namespace", "uid", "creationTimestamp", "resourceVersion", "generation"):
            if key in current["metadata"]:
                meta[key] = current["metadata"][key]
        new["apiVersion"], new["kind"] = kind.api_version, kind.kind
        if new == current:
            return new
        content = ("metadata", "status") if kind.has_status else ("metadata",)
        if {k: v for k, v in new.items() if k not in content} != {k: v for k, v in current.items() if k not in content}:
            meta["generation"] = meta.get("generation", 1) + 1
        if errors := validation_errors(kind, new):
            raise invalid(kind, meta["name"], errors)
        return new

    def _user_of(self, request: web.Request) -> tuple[str, tuple[str, ...]]:
        """(username, groups) of the request's bearer token (`tokens`), else the anonymous user."""
        header = request.headers.get("Authorization", "")
        token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        known = self.tokens.get(token)
        return (known[0], tuple(known[1])) if known is not None else ANONYMOUS

    async def _admit(
        self,
        operation: str,
        kind: ResourceKind,
        obj: Json | None,
        old: Json | None,
        subresource: str | None,
        user: tuple[str, tuple[str, ...]],
    ) -> None:
        if self.admission is None or subresource is not None:
            return
        meta = (obj if obj is not None else old or {}).get("metadata", {})
        attributes = AdmissionAttributes(
            operation,
            kind,
            meta.get("namespace", ""),
            meta.get("name", ""),
            copy.deepcopy(obj),
            copy.deepcopy(old),
            user[0],
            user[1],
        )
        await self.admission(attributes)

    def _is_stored(self, kind: ResourceKind, current: Json) -> bool:
        """Whether `current` is still the stored object (not changed or deleted since it was read)."""
        meta = current["metadata"]
        return self._store[kind.plural].get((meta.get("namespace", ""), meta["name"])) is current

    def _still(self, kind: ResourceKind, current: Json) -> None:
        """409 when the object admission saw as current was changed or deleted meanwhile."""
        meta = current["metadata"]
        if not self._is_stored(kind, current):
            raise ApiError(
                409,
                f'Operation cannot be fulfilled on {kind.resource} "{meta["name"]}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                details={"name": meta["name"], "group": kind.group, "kind": kind.plural},
            )

    # HTTP

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        try:
            segments = [s for s in request.path.split("/") if s]
            if (discovery := self._discovery(segments)) is not None:
                self.requests.append(RecordedRequest("get", request.path, content_type))
                return web.json_response(discovery)
            if segments == ["apis", "authentication.k8s.io", "v1", "tokenreviews"] and request.method == "POST":
                return self._review_token(await request.read())
            if (
                len(segments) == 7
                and segments[:3] == ["api", "v1", "namespaces"]
                and segments[4::2] == ["pods", "eviction"]
            ):
                return self._evict(request, segments[3], segments[5], await request.read())
            if (
                len(segments) == 7
                and segments[:3] == ["api", "v1", "namespaces"]
                and segments[4::2] == ["pods", "binding"]
            ):
                return self._bind(request, segments[3], segments[5], await request.read())
            kind, namespace, name, subresource = self._route(segments)
            verb = self._verb(request, name)
            self.requests.append(RecordedRequest(verb, request.path, content_type))
            if request.method != "GET":
                self.bodies.append(SentBody(verb, request.path, _parsed(await request.read())))
            arrived = time.monotonic()
            user = self._user_of(request)
            response = await self._serve(request, kind, namespace, name, subresource, verb, content_type, user)
            self.answered.append(AnsweredRequest(arrived, verb, request.path, response.status))
            return response
        except ApiError as error:
            headers = {"Retry-After": "1"} if error.code == 429 else None
            return web.json_response(error.status(), status=error.code, headers=headers)

    async def _serve(
        self,
        request: web.Request,
        kind: ResourceKind,
        namespace: str | None,
        name: str | None,
        subresource: str | None,
        verb: str,
        content_type: str,
        user: tuple[str, tuple[str, ...]],
    ) -> web.StreamResponse:
        try:
            await self._degrade(request.path, verb)
            self._inject_fault(verb, kind)
            if verb == "create" and kind.namespaced and namespace is None:
                raise ApiError(405, f"create {kind.resource} needs a namespace in the path")
            if verb == "watch":
                return await self._watch(request, kind, namespace)
            if verb == "list":
                return web.json_response(self._list(kind, namespace, request.query))
            if verb == "get":
                return web.json_response(copy.deepcopy(self._require(kind, namespace or "", name or "")))
            if verb == "delete":
                current = self._require(kind, namespace or "", name or "")
                options = _parsed(await request.read())
                wanted_uid = ((options or {}).get("preconditions") or {}).get("uid")
                if wanted_uid and wanted_uid != current["metadata"].get("uid"):
                    raise ApiError(
                        409,
                        f"Precondition failed: UID in precondition: {wanted_uid}, UID in object meta: "
                        f"{current['metadata'].get('uid')}",
                    )
                await self._admit("DELETE", kind, None, current, subresource, user)
                self._still(kind, current)
                return web.json_response(self._commit(kind, copy.deepcopy(current), "DELETED", current))
            body = await request.read()
            if verb == "create":
                obj = self._create(kind, namespace, self._body(kind, body, namespace))
                await self._admit("CREATE", kind, obj, None, subresource, user)
                if (namespace or "", obj["metadata"]["name"]) in self._store[kind.plural]:
                    raise self._exists(kind, obj["metadata"]["name"])
                return web.json_response(self._commit(kind, obj, "ADDED", None), status=201)
            for _ in range(UPDATE_ATTEMPTS):
                if verb == "patch":
                    current, new = self._patched(kind, namespace or "", name or "", body, content_type, subresource)
                else:
                    obj = self._body(kind, body, namespace)
                    current, new = self._updated(kind, namespace or "", name or "", obj, subresource)
                new = self._written(kind, current, new)
                await self._admit("UPDATE", kind, new, current, subresource, user)
                if self._is_stored(kind, current):  # else changed meanwhile: again from the new state (a
                    break  # resourceVersion precondition then fails in _updated / _patched, as on the real server)
            else:
                self._still(kind, current)
            if new == current:
                return web.json_response(copy.deepcopy(current))
            return web.json_response(self._commit(kind, new, "MODIFIED", current))
        except ApiError as error:
            headers = {"Retry-After": "1"} if error.code == 429 else None
            return web.json_response(error.status(), status=error.code, headers=headers)

    def _review_token(self, raw: bytes) -> web.StreamResponse:
        """POST tokenreviews: authenticated as `tokens[token]` = (username, groups) with `token_extra[token]`, when
        the review's audiences (if any) meet the token's; else not."""
        review = json.loads(raw)
        self.requests.append(
            RecordedRequest("create", "/apis/authentication.k8s.io/v1/tokenreviews", "application/json")
        )
        spec = review.get("spec", {})
        token = spec.get("token", "")
        known = self.tokens.get(token)
        status: Json = {"authenticated": False}
        wanted, issued_for = spec.get("audiences") or [], self.token_audiences.get(token, [])
        if known is not None and (not wanted or set(wanted) & set(issued_for)):
            user: Json = {"username": known[0], "groups": list(known[1])}
            if token in self.token_extra:
                user["extra"] = {k: list(v) for k, v in self.token_extra[token].items()}
            status = {"authenticated": True, "user": user}
            if wanted:
                status["audiences"] = sorted(set(wanted) & set(issued_for))
        elif known is not None:
            status = {"authenticated": False, "error": "token audiences are invalid"}
        return web.json_response({**review, "status": status}, status=201)

    def _evict(self, request: web.Request, namespace: str, name: str, raw: bytes) -> web.StreamResponse:
        """POST pods/<name>/eviction (policy/v1): 409 when deleteOptions.preconditions.uid names another pod, 429
        while the pod is in `eviction_blocked` (as a PodDisruptionBudget would answer), else the pod is deleted."""
        if request.method != "POST":
            raise ApiError(405, f"{request.method} is not supported on {request.path}")
        self.requests.append(RecordedRequest("evict", request.path, "application/json"))
        self.bodies.append(SentBody("evict", request.path, _parsed(raw)))
        pods = self.resource_kind("Pod")
        self._inject_fault("evict", pods)
        current = self._require(pods, namespace, name)
        body = json.loads(raw) if raw else {}
        wanted_uid = ((body.get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
        if wanted_uid and wanted_uid != current["metadata"].get("uid"):
            raise ApiError(
                409,
                f"Precondition failed: UID in precondition: {wanted_uid}, UID in object meta: "
                f"{current['metadata'].get('uid')}",
            )
        if (namespace, name) in self.eviction_blocked:
            raise ApiError(429, "Cannot evict pod as it would violate the pod's disruption budget.")
        self._commit(pods, copy.deepcopy(current), "DELETED", current)
        if self.on_evicted is not None:
            self.on_evicted(copy.deepcopy(current))
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"}, status=201)

    def _bind(self, request: web.Request, namespace: str, name: str, raw: bytes) -> web.StreamResponse:
        """POST pods/<name>/binding (core/v1 Binding): sets spec.nodeName to the target Node and PodScheduled True.
        404 without the pod; 409 when metadata.uid names another pod or the pod is already on a node; 400 when the
        Binding names another pod, 422 when its target is not a Node, as the real server answers."""
        if request.method != "POST":
            raise ApiError(405, f"{request.method} is not supported on {request.path}")
        self.requests.append(RecordedRequest("bind", request.path, "application/json"))
        pods = self.resource_kind("Pod")
        self._inject_fault("bind", pods)
        body = json.loads(raw) if raw else {}
        meta, target = body.get("metadata") or {}, body.get("target") or {}
        if meta.get("name") != name:
            raise ApiError(400, "name in URL does not match name in Binding object")
        if target.get("kind", "Node") != "Node" or not target.get("name"):
            raise ApiError(422, f'Binding.core "{name}" is invalid: target: a Node name is required')
        current = self._require(pods, namespace, name)
        wanted_uid = meta.get("uid")
        if wanted_uid and wanted_uid != current["metadata"].get("uid"):
            raise ApiError(
                409,
                f'Operation cannot be fulfilled on pods/binding "{name}": Precondition failed: UID in precondition: '
                f"{wanted_uid}, UID in object meta: {current['metadata'].get('uid')}",
            )
        if bound := current.get("spec", {}).get("nodeName"):
            raise ApiError(
                409,
                f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already assigned to node '
                f'"{bound}"',
            )
        pod = copy.deepcopy(current)
        pod.setdefault("spec", {})["nodeName"] = target["name"]
        status = pod.setdefault("status", {})
        scheduled = {
            "type": "PodScheduled",
            "status": "True",
            "lastTransitionTime": self._clock().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        status["conditions"] = [
            *(c for c in status.get("conditions", []) if c.get("type") != "PodScheduled"),
            scheduled,
        ]
        self._commit(pods, pod, "MODIFIED", current)
        success = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        return web.json_response(success, status=201)

    def _discovery(self, segments: list[str]) -> Json | None:
        if segments == ["version"]:
            return {"major": "1", "minor": "30", "gitVersion": "v1.30.0-fake", "platform": "linux/amd64"}
        if segments == ["api"]:
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": self.url}],
            }
        if segments == ["apis"]:
            groups = sorted({(k.group, k.version) for k in self.kinds if k.group})
            entries = [{"groupVersion": f"{g}/{v}", "version": v} for g, v in groups]
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {"name": e["groupVersion"].split("/")[0], "versions": [e], "preferredVersion": e} for e in entries
                ],
            }
        kinds = [k for k in self.kinds if k.prefix.strip("/").split("/") == segments]
        if not kinds:
            return None
        verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
        resources = []
        for k in kinds:
            resources.append(
                {
                    "name": k.plural,
                    "singularName": k.kind.lower(),
                    "namespaced": k.namespaced,
                    "kind": k.kind,
                    "verbs": verbs,
                }
            )
            if k.has_status:
                resources.append(
                    {
                        "name": f"{k.plural}/status",
                        "singularName": "",
                        "namespaced": k.namespaced,
                        "kind": k.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": kinds[0].api_version,
            "resources": resources,
        }

    def _route(self, segments: list[str]) -> tuple[ResourceKind, str | None, str | None, str | None]:
        """(kind, namespace, name, subresource) for a resource path, else 404 like the real server."""
        not_found = ApiError(404, "the server could not find the requested resource")
        if segments[:1] == ["api"] and len(segments) >= 3:
            group, version, rest = "", segments[1], segments[2:]
        elif segments[:1] == ["apis"] and len(segments) >= 4:
            group, version, rest = segments[1], segments[2], segments[3:]
        else:
            raise not_found
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise not_found
        plural = rest[0]
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        for kind in self.kinds:
            if (kind.group, kind.version, kind.plural) == (group, version, plural):
                break
        else:
            raise not_found
        if (namespace is not None and not kind.namespaced) or (namespace is None and name and kind.namespaced):
            raise not_found
        if subresource is not None and (subresource != "status" or not kind.has_status):
            raise not_found
        return kind, namespace, name, subresource

    @staticmethod
    def _verb(request: web.Request, name: str | None) -> str:
        if request.method == "GET":
            return "get" if name else "watch" if _flag(request.query, "watch") else "list"
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(request.method)
        if verb is None or (verb == "create") == (name is not None):
            raise ApiError(405, f"{request.method} is not supported on {request.path}")
        return verb

    async def _degrade(self, path: str, verb: str) -> None:
        degradation = next((d for d in self._degradations if path.startswith(d.path_prefix)), None)
        if degradation is None:
            return
        if degradation.latency_seconds:
            await asyncio.sleep(degradation.latency_seconds)
        if self._fault_random.random() < degradation.failure_ratio:
            raise ApiError(degradation.status, f"injected fault: {verb} {path} answered {degradation.status}")

    def _inject_fault(self, verb: str, kind: ResourceKind) -> None:
        for fault in self._faults:
            if (fault.verb, fault.plural) == (verb, kind.plural) and fault.times > 0:
                fault.times -= 1
                raise ApiError(fault.status, f"injected fault: {verb} {kind.resource} answered {fault.status}")

    def _body(self, kind: ResourceKind, raw: bytes, namespace: str | None) -> Json:
        try:
            obj = json.loads(raw)
        except ValueError as error:
            raise ApiError(400, f"request body is not JSON: {error}") from None
        if not isinstance(obj, dict):
            raise ApiError(400, "request body must be a JSON object")
        if obj.get("kind", kind.kind) != kind.kind or obj.get("apiVersion", kind.api_version) != kind.api_version:
            raise ApiError(
                400,
                f"expected {kind.api_version}, Kind={kind.kind}, got {obj.get('apiVersion')}, Kind={obj.get('kind')}",
            )
        meta = obj.setdefault("metadata", {})
        if namespace is not None:
            if meta.setdefault("namespace", namespace) != namespace:
                raise ApiError(
                    400, "the namespace of the provided object does not match the namespace sent on the request"
                )
        else:
            meta.pop("namespace", None)
        return obj

    def _matching(self, kind: ResourceKind, namespace: str | None, selector: list[Requirement]) -> list[Json]:
        store = self._store[kind.plural]
        return [
            store[key]
            for key in sorted(store)
            if (namespace is None or key[0] == namespace) and all(r.matches(store[key]) for r in selector)
        ]

    @staticmethod
    def _selector(query: Any) -> list[Requirement]:
        return parse_selector(query.get("labelSelector", ""), on_labels=True) + parse_selector(
            query.get("fieldSelector", ""), on_labels=False
        )

    def _list(self, kind: ResourceKind, namespace: str | None, query: Any) -> Json:
        items = copy.deepcopy(self._matching(kind, namespace, self._selector(query)))
        return {
            "kind": f"{kind.kind}List",
            "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": str(self._resource_version)},
            "items": items,
        }

    def _create(self, kind: ResourceKind, namespace: str | None, obj: Json) -> Json:
        """The object to store for a create (named, stamped, checked against the schema); not stored yet."""
        meta = obj["metadata"]
        if meta.get("resourceVersion"):
            raise ApiError(400, "resourceVersion should not be set on objects to be created")
        if not meta.get("name") and meta.get("generateName"):
            alphabet = "bcdfghjklmnpqrstvwxz2456789"
            meta["name"] = meta["generateName"] + "".join(self._random.choice(alphabet) for _ in range(5))
        if not meta.get("name"):
            raise invalid(kind, "", [("metadata.name", "Required value: name or generateName is required")])
        if (namespace or "", meta["name"]) in self._store[kind.plural]:
            raise self._exists(kind, meta["name"])
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        if kind.has_status and kind.plural != "nodes":  # creating cannot set status (kubelets do for nodes)
            obj.pop("status", None)
            if kind.plural == "pods":
                obj["status"] = {"phase": "Pending"}
        meta.pop("uid", None)
        self._stamp_new(meta)
        meta["generation"] = 1
        if errors := validation_errors(kind, obj):
            raise invalid(kind, meta["name"], errors)
        return obj

    @staticmethod
    def _exists(kind: ResourceKind, name: str) -> ApiError:
        return ApiError(
            409,
            f'{kind.resource} "{name}" already exists',
            reason="AlreadyExists",
            details={"name": name, "group": kind.group, "kind": kind.plural},
        )

    def _check_version(self, kind: ResourceKind, current: Json, proposed: Json, *, required: bool) -> None:
        version = (proposed.get("metadata") or {}).get("resourceVersion")
        name = current["metadata"]["name"]
        if not version and required:
            raise invalid(
                kind, name, [("metadata.resourceVersion", "Invalid value: 0x0: must be specified for an update")]
            )
        if version and version != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                f'Operation cannot be fulfilled on {kind.resource} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                details={"name": name, "group": kind.group, "kind": kind.plural},
            )

    @staticmethod
    def _apply_subresource(kind: ResourceKind, current: Json, proposed: Json, subresource: str | None) -> Json:
        """What a write may change: only .status through /status, anything but .status on the main resource."""
        base, source = (current, proposed) if subresource == "status" else (proposed, current)
        if subresource != "status" and not kind.has_status:
            return proposed
        result = copy.deepcopy(base)
        result.pop("status", None)
        if "status" in source:
            result["status"] = copy.deepcopy(source["status"])
        return result

    def _updated(
        self, kind: ResourceKind, namespace: str, name: str, obj: Json, subresource: str | None
    ) -> tuple[Json, Json]:
        """(the stored object, what an update with `obj` makes of it before `_written`)."""
        current = self._require(kind, namespace, name)
        if obj["metadata"].get("name") != name:
            raise ApiError(
                400,
                f"the name of the object ({obj['metadata'].get('name')}) does not match the name on the URL ({name})",
            )
        self._check_version(kind, current, obj, required=kind.is_custom)
        return current, self._apply_subresource(kind, current, obj, subresource)

    def _patched(
        self, kind: ResourceKind, namespace: str, name: str, raw: bytes, content_type: str, subresource: str | None
    ) -> tuple[Json, Json]:
        """(the stored object, what the patch makes of it before `_written`)."""
        current = self._require(kind, namespace, name)
        try:
            patch = json.loads(raw)
        except ValueError as error:
            raise ApiError(400, f"patch body is not JSON: {error}") from None
        if content_type == "application/json-patch+json":
            patched = json_patch(current, patch)
        elif content_type == "application/merge-patch+json":
            patched = merge_patch(current, patch)
        elif content_type == "application/strategic-merge-patch+json" and not kind.is_custom:
            patched = merge_patch(current, patch, strategic=True)
        else:
            raise ApiError(
                415,
                f"the body of the request was in an unknown format ({content_type}) - accepted "
                "media types include: application/json-patch+json, application/merge-patch+json"
                + ("" if kind.is_custom else ", application/strategic-merge-patch+json"),
            )
        if not isinstance(patched, dict):
            raise invalid(kind, name, [("<root>", "the patched object is not a JSON object")])
        self._check_version(kind, current, patched, required=False)
        return current, self._apply_subresource(kind, current, patched, subresource)

    async def _watch(self, request: web.Request, kind: ResourceKind, namespace: str | None) -> web.StreamResponse:
        since, query = request.query.get("resourceVersion", ""), request.query
        watch = _Watch(kind, namespace, self._selector(query), _flag(query, "allowWatchBookmarks"))
        if since in ("", "0"):  # start from the current state, as synthetic ADDED events
            for obj in self._matching(kind, namespace, watch.selector):
                watch.queue.put_nowait({"type": "ADDED", "object": copy.deepcopy(obj)})
        elif not since.isdigit():
            raise ApiError(400, f"invalid resourceVersion {since!r}")
        elif int(since) < self._oldest_resumable:
            expired = ApiError(410, f"too old resource version: {since} ({self._oldest_resumable})")
            watch.queue.put_nowait({"type": "ERROR", "object": expired.status()})
            watch.queue.put_nowait(_END)
        else:
            for change in self._history:
                if change.resource_version > int(since) and (event := watch.event(change)) is not None:
                    watch.queue.put_nowait(event)
        if self._closing:
            watch.queue.put_nowait(_END)
        self._watches.add(watch)  # in the same step as the replay above: no change can fall in between
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        try:
            await response.prepare(request)
            try:
                async with asyncio.timeout(timeout):
                    while (item := await watch.queue.get()) != _END:
                        if item == _ABORT:
                            if request.transport is not None:
                                request.transport.abort()
                            return response
                        await response.write(json.dumps(item).encode() + b"\n")
            except TimeoutError:
                pass  # timeoutSeconds ran out: end the stream cleanly, as the real server does
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away
        finally:
            self._watches.discard(watch)
        return response
