"""The one place that says which names koordbus takes: Kubernetes' own rules for the names that reach a subject, a
KV key, a path, a database key or a label. Pure.

Every entry point checks its names here before they go further: the API's path and query parameters
(services.api) and the quota commands (services.quota.core, whatever their intake: REST, CLI, the cluster),
the Kubernetes bridge's observed objects (services.k8s.observer), the agent's inputs (its node name, the kubelet's
pod list, cgroup directory names: agent.core) and the CLI. A refused name raises `InvalidName`, which names the
field and says why in plain words (the API answers it with a 4xx); the value is shown shortened, so a
100,000-character name does not make a 100,000-character message.

The rules (Kubernetes' apimachinery validation): object names (nodes, quotas, profiles, pods, migration jobs) are
DNS-1123 subdomains of at most 253 characters; namespaces are DNS-1123 labels of at most 63; label values (the quota
parent and tree-id labels) are at most 63 characters of alphanumerics, `-`, `_`, `.`, beginning and ending with an
alphanumeric (empty allowed where the label may be absent); label and annotation keys are qualified names (`name` or
`prefix/name`: a DNS-1123 subdomain prefix, a name of at most 63 such characters); a pod UID is an RFC 4122 UUID or
the 32 hex digits of a static pod's config hash; a container ID 8 to 64 lowercase hex digits. A NodeSLO host
application's name (Koordinator takes any string; it names a cgroup directory when the entry has no cgroupPath) is
ours: at most 128 letters, digits, `-`, `_` and `.`, beginning and ending with a letter or digit, so it is one plain
path component. Every match is a `fullmatch`: a trailing newline is not a name.
"""

from __future__ import annotations

import re
from typing import Final

MAX_OBJECT_NAME: Final = 253
MAX_LABEL: Final = 63
MAX_HOST_APPLICATION_NAME: Final = 128
MAX_SHOWN: Final = 40
"""Characters of a refused value quoted back in the message."""

_LABEL: Final = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL: Final = re.compile(_LABEL)
_DNS1123_SUBDOMAIN: Final = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_LABEL_VALUE: Final = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_POD_UID: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}")
_CONTAINER_ID: Final = re.compile(r"[0-9a-f]{8,64}")
_HOST_APPLICATION_NAME: Final = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"


SUBDOMAIN_PATTERN: Final = rf"^{_LABEL}(?:\.{_LABEL})*\Z"
r"""A DNS-1123 subdomain for a msgspec.Meta pattern (msgspec searches: `\Z`, as `$` would let a trailing newline
through); with max_length=MAX_OBJECT_NAME it is `object_name` in a schema."""


NAMESPACE_PATTERN: Final = rf"^{_LABEL}\Z"
"""A namespace (a DNS-1123 label) for a msgspec.Meta pattern, with max_length=MAX_LABEL."""
UID_PATTERN: Final = r"^[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?\Z"
"""An object's uid for a msgspec.Meta pattern (what `uid` takes), with max_length=MAX_OBJECT_NAME."""


HOST_APPLICATION_NAME_PATTERN: Final = rf"^{_HOST_APPLICATION_NAME}\Z"
"""A host application's name for a msgspec.Meta pattern (with max_length=MAX_HOST_APPLICATION_NAME)."""


class InvalidName(ValueError):
    """A name that is not what its field takes; `field` names the field, `reason` says why."""

    def __init__(self, field: str, value: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"invalid {field} {shown(value)}: {reason}")


def shown(value: str) -> str:
    """`value` quoted for a message, cut to MAX_SHOWN characters (with its length when cut)."""
    if len(value) <= MAX_SHOWN:
        return repr(value)
    return f"{value[:MAX_SHOWN]!r}… ({len(value)} characters)"


def _check(value: str, field: str, pattern: re.Pattern[str], limit: int, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidName(field, repr(value), f"must be a string ({what})")
    if len(value) > limit:
        raise InvalidName(field, value, f"is {len(value)} characters long; at most {limit} ({what})")
    if not pattern.fullmatch(value):
        raise InvalidName(field, value, f"must be {what}")
    return value


_SUBDOMAIN_WHAT: Final = (
    "a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', beginning and ending with a letter or digit"
)
_LABEL_WHAT: Final = "a DNS-1123 label: lowercase letters, digits and '-', beginning and ending with a letter or digit"
_LABEL_VALUE_WHAT: Final = (
    "a Kubernetes label value: letters, digits, '-', '_' and '.', beginning and ending with a letter or digit"
)


def object_name(value: str, field: str = "name") -> str:
    """A Kubernetes object name (node, pod, quota, profile, migration job …): a DNS-1123 subdomain, <= 253."""
    if not value:
        raise InvalidName(field, value, "must not be empty")
    return _check(value, field, _DNS1123_SUBDOMAIN, MAX_OBJECT_NAME, _SUBDOMAIN_WHAT)


def node_name(value: str, field: str = "node") -> str:
    """A node's name (Kubernetes validates node names as object names)."""
    return object_name(value, field)


def namespace(value: str, field: str = "namespace") -> str:
    """A namespace: a DNS-1123 label, <= 63."""
    if not value:
        raise InvalidName(field, value, "must not be empty")
    return _check(value, field, _DNS1123_LABEL, MAX_LABEL, _LABEL_WHAT)


def label_value(value: str, field: str = "label value") -> str:
    """A label's value, <= 63 (empty allowed: check presence where a label is required)."""
    return _check(value, field, _LABEL_VALUE, MAX_LABEL, _LABEL_VALUE_WHAT)


_QUALIFIED_WHAT: Final = (
    "a qualified name: an optional DNS-1123 subdomain prefix of at most 253 characters and '/', then at most 63 "
    "letters, digits, '-', '_' and '.', beginning and ending with a letter or digit"
)


def qualified_name(value: str, field: str = "key") -> str:
    """A label or annotation key: `name` or `prefix/name` (Kubernetes' IsQualifiedName)."""
    if not isinstance(value, str):
        raise InvalidName(field, repr(value), f"must be a string ({_QUALIFIED_WHAT})")
    if len(value) > MAX_OBJECT_NAME + 1 + MAX_LABEL:
        raise InvalidName(field, value, f"is {len(value)} characters long; must be {_QUALIFIED_WHAT}")
    prefix, slash, name = value.rpartition("/")
    good_prefix = not slash or (len(prefix) <= MAX_OBJECT_NAME and _DNS1123_SUBDOMAIN.fullmatch(prefix) is not None)
    if not (good_prefix and name and len(name) <= MAX_LABEL and _LABEL_VALUE.fullmatch(name)):
        raise InvalidName(field, value, f"must be {_QUALIFIED_WHAT}")
    return value


def tree_id(value: str, field: str = "tree") -> str:
    """A quota tree: the value of a quota's tree-id label, or the name of the profile whose tree it is (an object
    name: a profile without a tree-id label names its tree)."""
    if not value:
        raise InvalidName(field, value, "must not be empty")
    if len(value) <= MAX_LABEL and _LABEL_VALUE.fullmatch(value):
        return value
    if len(value) <= MAX_OBJECT_NAME and _DNS1123_SUBDOMAIN.fullmatch(value):
        return value
    return label_value(value, field)  # raises, saying what a label value is


def uid(value: str, field: str = "uid") -> str:
    """An object's uid as a filter (a controller's uid): what a label value allows, up to 253 characters (the API
    server generates UUIDs; fixtures and other sources use shorter tokens)."""
    if not value:
        raise InvalidName(field, value, "must not be empty")
    return _check(value, field, _LABEL_VALUE, MAX_OBJECT_NAME, "a uid: letters, digits, '-', '_' and '.'")


def is_pod_uid(value: str) -> bool:
    """An RFC 4122 UUID, or the 32 hex digits of a static pod's config hash (what the kubelet names cgroups by)."""
    return _POD_UID.fullmatch(value) is not None


def pod_uid(value: str, field: str = "pod uid") -> str:
    if not is_pod_uid(value):
        raise InvalidName(field, value, "must be a pod UID (an RFC 4122 UUID or 32 lowercase hex digits)")
    return value


def is_container_id(value: str) -> bool:
    """8 to 64 lowercase hex digits (what container runtimes name containers and their cgroups by)."""
    return _CONTAINER_ID.fullmatch(value) is not None


def container_id(value: str, field: str = "container id") -> str:
    if not is_container_id(value):
        raise InvalidName(field, value, "must be a container ID (8 to 64 lowercase hex digits)")
    return value


_HOST_APPLICATION_NAME_RE: Final = re.compile(_HOST_APPLICATION_NAME)


def host_application_name(value: str, field: str = "host application name") -> str:
    """A NodeSLO host application's name: letters, digits, '-', '_' and '.', beginning and ending with a letter or
    digit, <= 128 (one plain cgroup path component: never '.', '..' or anything with a '/')."""
    if isinstance(value, str) and not value:
        raise InvalidName(field, value, "must not be empty")
    return _check(
        value,
        field,
        _HOST_APPLICATION_NAME_RE,
        MAX_HOST_APPLICATION_NAME,
        "letters, digits, '-', '_' and '.', beginning and ending with a letter or digit",
    )
