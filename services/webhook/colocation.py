"""ClusterColocationProfile mutation of a Pod at CREATE (spec §10.2–10.4): the first step of koord-manager's Pod
mutating webhook. Pure: the Pod is a JSON object (a dict) and comes back mutated; nothing else is read.

Matching (§10.2): profiles in lexicographic order of name; a profile with a `namespaceSelector` matches when the
selector matches the Namespace's labels, and also when the Namespace is unknown or the selector invalid (Koordinator
counts an evaluation that fails as a match); the same for `selector` and the Pod's labels. Applying one (§10.3):
the probability draw, then labels, annotations, the key mappings, label suffixes, schedulerName, the QoS label, the
PriorityClass (priority, priorityClassName, preemptionPolicy; an unknown one is an error), the koordinator priority
label and the strategic merge patch. After every matched profile (§10.4), unless one of them carries the
skip-update-resources annotation or the feature gate says so, a koord-batch (koord-mid) Pod's native cpu and memory
requests, limits and overhead become batch (mid) resources, cpu as an integer milli-core count, and a limit without a
request gets the request. `mutate_pod` answers the Pod as Kubernetes reads it (the webhook's patch is computed from
it); `mutate` gives every resource amount as an integer by the calc unit rule (cpu millicores, the rest Value()), so
a translated and an untranslated Pod read the same way.

Used by the webhook service (services.webhook.admission, `mutate_pod`) and `koordbus calc colocation-profile`
(koordbus.calc_profile, `mutate`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import msgspec

from schemas import kube, quantity, vocab
from schemas.selectors import LabelSelector, selector_matches

SKIP_UPDATE_RESOURCES: Final = "config.koordinator.sh/skip-update-resources"
PRIORITY_LABEL: Final = "koordinator.sh/priority"
_TRANSLATED: Final[Mapping[str, tuple[str, str]]] = {
    vocab.PRIORITY_BATCH: ("kubernetes.io/batch-cpu", "kubernetes.io/batch-memory"),
    vocab.PRIORITY_MID: ("kubernetes.io/mid-cpu", "kubernetes.io/mid-memory"),
}
_CONTAINER_LISTS: Final = ("initContainers", "containers")

# Strategic merge patch: the lists of a Pod that merge element by element, by this key (the rest are replaced).
_MERGE_KEYS: Final[Mapping[tuple[str, ...], str]] = {
    ("spec", "containers"): "name",
    ("spec", "initContainers"): "name",
    ("spec", "ephemeralContainers"): "name",
    ("spec", "volumes"): "name",
    ("spec", "imagePullSecrets"): "name",
    ("spec", "hostAliases"): "ip",
    ("spec", "containers", "env"): "name",
    ("spec", "initContainers", "env"): "name",
    ("spec", "containers", "ports"): "containerPort",
    ("spec", "initContainers", "ports"): "containerPort",
    ("spec", "containers", "volumeMounts"): "mountPath",
    ("spec", "initContainers", "volumeMounts"): "mountPath",
    ("metadata", "ownerReferences"): "uid",
}
_SET_LISTS: Final = frozenset({("metadata", "finalizers")})
"""Lists of strings that merge as sets."""


class ProfileError(ValueError):
    """What the webhook refuses the Pod for: an invalid probability, an unknown PriorityClass, a failing patch."""


class PriorityClass(msgspec.Struct, frozen=True, kw_only=True):
    value: int
    preemption_policy: str | None = None


def _selector(raw: Any) -> LabelSelector | None:
    """None when the selector does not decode (an invalid one, which matches)."""
    try:
        return msgspec.convert(raw, LabelSelector)
    except msgspec.ValidationError:
        return None


def _matches(raw_selector: Any, labels: Mapping[str, str] | None) -> bool:
    """A set selector against `labels` (None: the object could not be read); a failed evaluation matches."""
    if labels is None:
        return True
    selector = _selector(raw_selector)
    if selector is None:
        return True
    from schemas.selectors import selector_problems

    if selector_problems(selector):
        return True
    return selector_matches(selector, labels)


def profile_matches(profile: Mapping[str, Any], pod_labels: Mapping[str, str], namespace_labels: Any) -> bool:
    """§10.2: `namespace_labels` None means the Namespace could not be read."""
    spec = profile.get("spec") or {}
    if not isinstance(spec, Mapping):
        return True  # unreadable: apply_profile refuses it
    if spec.get("namespaceSelector") is not None and not _matches(spec["namespaceSelector"], namespace_labels):
        return False
    return spec.get("selector") is None or _matches(spec["selector"], pod_labels)


def probability_percent(raw: Any) -> int:
    """The profile's probability as a percent (absent: 100); ProfileError for a string without `%` or a number
    that does not parse."""
    if raw is None:
        return 100
    if isinstance(raw, bool):
        raise ProfileError(f"invalid probability {raw!r}")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and raw.endswith("%") and raw[:-1].lstrip("-").isdigit():
        try:
            return int(raw[:-1])
        except ValueError:  # more digits than Python converts (a Pod is refused for the profile, not for itself)
            raise ProfileError(f"invalid probability: {len(raw)} characters") from None
    raise ProfileError(f"invalid value for IntOrString: invalid type: string is not a percentage: {raw!r}")


def _strings(raw: Any, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise ProfileError(f"{where} must map strings to strings")
    return raw


_STRING_FIELDS: Final = ("schedulerName", "qosClass", "priorityClassName")


def _checked_spec(profile: Mapping[str, Any]) -> Mapping[str, Any]:
    """The profile's spec with the types of Koordinator's Go struct (the CRD's schema guarantees them on a real
    cluster; a profile built otherwise is refused rather than half applied)."""
    spec = profile.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise ProfileError("spec must be an object")
    for field in _STRING_FIELDS:
        if spec.get(field) is not None and not isinstance(spec[field], str):
            raise ProfileError(f"spec.{field} must be a string, got {spec[field]!r}")
    priority = spec.get("koordinatorPriority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise ProfileError(f"spec.koordinatorPriority must be an integer, got {priority!r}")
    return spec


def apply_profile(
    pod: dict[str, Any], profile: Mapping[str, Any], priority_classes: Mapping[str, PriorityClass]
) -> dict[str, Any]:
    """§10.3 step 2: the mutations of one profile, in their fixed order; the patched Pod."""
    spec = _checked_spec(profile)
    metadata = pod.setdefault("metadata", {})
    pod_spec = pod.setdefault("spec", {})
    if spec.get("labels"):
        metadata.setdefault("labels", {}).update(_strings(spec["labels"], "labels"))
    if spec.get("annotations"):
        metadata.setdefault("annotations", {}).update(_strings(spec["annotations"], "annotations"))
    for field, target in (("labelKeysMapping", "labels"), ("annotationKeysMapping", "annotations")):
        mapping = _strings(spec.get(field), field)
        if mapping:
            values = metadata.setdefault(target, {})
            for old, new in mapping.items():
                values[new] = values.get(old, "")
    suffixes = _strings(spec.get("labelSuffixes"), "labelSuffixes")
    if suffixes:
        labels = metadata.setdefault("labels", {})
        for key, suffix in suffixes.items():
            if key in labels:
                labels[key] = labels[key] + suffix
    if spec.get("schedulerName"):
        pod_spec["schedulerName"] = spec["schedulerName"]
    if spec.get("qosClass"):
        metadata.setdefault("labels", {})[vocab.QOS_CLASS_LABEL] = spec["qosClass"]
    if spec.get("priorityClassName"):
        name = spec["priorityClassName"]
        found = priority_classes.get(name)
        if found is None:
            raise ProfileError(f'priorityclasses.scheduling.k8s.io "{name}" not found')
        pod_spec["priorityClassName"] = name
        pod_spec["priority"] = found.value
        if found.preemption_policy is None:
            pod_spec.pop("preemptionPolicy", None)
        else:
            pod_spec["preemptionPolicy"] = found.preemption_policy
    if spec.get("koordinatorPriority") is not None:
        metadata.setdefault("labels", {})[PRIORITY_LABEL] = str(spec["koordinatorPriority"])
    patch = spec.get("patch")
    if patch is not None:
        pod = strategic_merge(pod, patch_object(patch))
        try:
            msgspec.convert(pod, kube.Pod)
        except msgspec.ValidationError as e:
            raise ProfileError(f"the patch does not leave a valid Pod: {e}") from None
    return pod


def patch_object(patch: Any) -> dict[str, Any]:
    if isinstance(patch, str):
        try:
            patch = msgspec.json.decode(patch)
        except msgspec.DecodeError as e:
            raise ProfileError(f"the patch is not JSON: {e}") from None
    if not isinstance(patch, dict):
        raise ProfileError("the patch must be a JSON object")
    return patch


def strategic_merge(original: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """`patch` applied to `original` as Kubernetes' strategic merge patch does for a Pod: objects merge key by key
    (`null` deletes), `$patch: replace` replaces an object, lists with a merge key merge element by element (an
    element with `$patch: delete` is removed), set lists take the union, other lists and values are replaced."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") not in (None, "merge"):
        raise ProfileError(f"unsupported $patch directive {patch['$patch']!r} at {'.'.join(path) or 'the Pod'}")
    out = dict(original) if isinstance(original, dict) else {}
    for key, value in patch.items():
        if key == "$patch":
            continue
        where = (*path, key)
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            out[key] = strategic_merge(out.get(key), value, where)
        elif isinstance(value, list) and _list_key(where) is not None and isinstance(out.get(key), list):
            out[key] = _merge_list(out[key], value, _list_key(where) or "", where)
        elif isinstance(value, list) and where in _SET_LISTS and isinstance(out.get(key), list):
            out[key] = out[key] + [v for v in value if v not in out[key]]
        else:
            out[key] = copy.deepcopy(value)
    return out


def _list_key(path: tuple[str, ...]) -> str | None:
    return _MERGE_KEYS.get(path)


def _merge_list(original: list[Any], patch: list[Any], key: str, path: tuple[str, ...]) -> list[Any]:
    out = list(original)
    for element in patch:
        if not isinstance(element, dict) or key not in element:
            raise ProfileError(f"an element of {'.'.join(path)} lacks its merge key {key!r}")
        index = next((i for i, e in enumerate(out) if isinstance(e, dict) and e.get(key) == element[key]), None)
        if element.get("$patch") == "delete":
            if index is not None:
                del out[index]
            continue
        if index is None:
            out.append(strategic_merge({}, element, path))
        else:
            out[index] = strategic_merge(out[index], element, path)
    return out


def _as_pod(pod: Mapping[str, Any]) -> kube.Pod:
    """The Pod typed; ValueError (malformed input, not a refusal) when it is not one."""
    try:
        return msgspec.convert(pod, kube.Pod)
    except msgspec.ValidationError as e:
        raise ValueError(f"not a Pod: {e}") from None


def _class_with_default(pod: Mapping[str, Any]) -> str:
    return kube.pod_priority_class(_as_pod(pod))


def _translate_list(resources_: dict[str, Any], cpu_name: str, memory_name: str) -> bool:
    changed = False
    if "cpu" in resources_:
        resources_[cpu_name] = str(quantity.milli_value(quantity.parse_quantity(resources_.pop("cpu"))))
        changed = True
    if "memory" in resources_:
        resources_[memory_name] = resources_.pop("memory")
        changed = True
    return changed


def translate_resources(pod: dict[str, Any]) -> bool:
    """§10.4 for a Pod of class koord-batch or koord-mid; whether anything was translated."""
    names = _TRANSLATED.get(_class_with_default(pod))
    if names is None:
        return False
    changed = False
    spec = pod.get("spec") or {}
    for list_name in _CONTAINER_LISTS:
        for container in spec.get(list_name) or []:
            requirements = container.get("resources")
            if not isinstance(requirements, dict):
                continue
            for kind in ("requests", "limits"):
                if isinstance(requirements.get(kind), dict):
                    changed |= _translate_list(requirements[kind], *names)
            limits = requirements.get("limits")
            if isinstance(limits, dict):
                for name in names:
                    if name in limits and name not in (requirements.get("requests") or {}):
                        requirements.setdefault("requests", {})[name] = limits[name]
                        changed = True
    if isinstance(spec.get("overhead"), dict):
        changed |= _translate_list(spec["overhead"], *names)
    return changed


def integer_amounts(pod: dict[str, Any]) -> None:
    """Every requests / limits / overhead amount as the calc unit rule's integer (ProfileError when one does not
    parse)."""
    spec = pod.get("spec") or {}
    lists = [c.get("resources") or {} for name in _CONTAINER_LISTS for c in spec.get(name) or []]
    targets = [r[k] for r in lists if isinstance(r, dict) for k in ("requests", "limits") if isinstance(r.get(k), dict)]
    if isinstance(spec.get("overhead"), dict):
        targets.append(spec["overhead"])
    for amounts in targets:
        for name, value in list(amounts.items()):
            try:
                amounts[name] = quantity.amount(name, value)
            except (quantity.QuantityError, TypeError, ValueError) as e:
                raise ValueError(f"resource {name!r}: {e}") from None


def mutate_pod(
    pod: Mapping[str, Any],
    profiles: Sequence[Mapping[str, Any]],
    *,
    namespace_labels: Mapping[str, str] | None,
    priority_classes: Mapping[str, PriorityClass],
    skip_mutating_resources: bool,
    draw: Callable[[], int],
) -> tuple[dict[str, Any], bool]:
    """The Pod after every matched profile and the resource translation, as the webhook answers it (amounts as the
    Pod wrote them, a translated cpu as the decimal string of its milli-core count, Koordinator's
    resource.NewQuantity(milli, DecimalSI)), and whether a profile was applied or a resource translated.
    ProfileError for what the webhook refuses; ValueError when `pod` is not a Pod (an unparsable quantity among
    them)."""
    _as_pod(pod)
    out = copy.deepcopy(dict(pod))
    labels = _strings((out.get("metadata") or {}).get("labels"), "the Pod's labels")
    matched = [
        p
        for p in sorted(profiles, key=lambda p: str((p.get("metadata") or {}).get("name", "")))
        if profile_matches(p, labels, namespace_labels)
    ]
    mutated = False
    for profile in matched:
        percent = probability_percent((profile.get("spec") or {}).get("probability"))
        if percent == 0 or (percent != 100 and draw() > percent):
            continue
        out = apply_profile(out, profile, priority_classes)
        mutated = True
    skip = skip_mutating_resources or any(
        SKIP_UPDATE_RESOURCES in ((p.get("metadata") or {}).get("annotations") or {}) for p in matched
    )
    if matched and not skip:
        mutated |= translate_resources(out)
    return out, mutated


def mutate(
    pod: Mapping[str, Any],
    profiles: Sequence[Mapping[str, Any]],
    *,
    namespace_labels: Mapping[str, str] | None,
    priority_classes: Mapping[str, PriorityClass],
    skip_mutating_resources: bool,
    draw: Callable[[], int],
) -> tuple[dict[str, Any], bool]:
    """`mutate_pod` with every amount as the calc unit rule's integer (`koordbus calc colocation-profile`)."""
    out, mutated = mutate_pod(
        pod,
        profiles,
        namespace_labels=namespace_labels,
        priority_classes=priority_classes,
        skip_mutating_resources=skip_mutating_resources,
        draw=draw,
    )
    integer_amounts(out)
    return out, mutated
