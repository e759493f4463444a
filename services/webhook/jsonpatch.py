"""An RFC 6902 JSON Patch from one JSON document to another: what a mutating webhook answers kube-apiserver
(`patchType: JSONPatch`). Pure.

`diff(original, mutated)` walks both documents: an object key that went away is a `remove`, a new one an `add`, a
changed value a `replace` (or the operations inside it when both sides are objects or arrays); arrays are compared
index by index, with the tail added or removed (from the end, so every index stays valid as the patch applies),
so the patch names each change rather than restating whole containers. Values compare as JSON does, with a
boolean never equal to a number (Python's `True == 1`). Keys are escaped as RFC 6901 pointers (`~` → `~0`, `/` →
`~1`: label keys such as `koordinator.sh/qosClass`). Applying the patch to `original` gives `mutated`
(tests/unit/test_webhook_admission.py holds that). Used by services.webhook.admission.
"""

from __future__ import annotations

from typing import Any

Operation = dict[str, Any]


def pointer_token(key: str) -> str:
    """One RFC 6901 reference token."""
    return key.replace("~", "~0").replace("/", "~1")


def equal(a: Any, b: Any) -> bool:
    """JSON equality: same type family and value, recursively (a bool is not a number; an int equals a float of the
    same value, as JSON numbers do)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and len(a) == len(b) and all(k in b and equal(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and bool(a == b)


def diff(original: Any, mutated: Any) -> list[Operation]:
    """The operations that turn `original` into `mutated` (empty when they are equal)."""
    operations: list[Operation] = []
    _diff(original, mutated, "", operations)
    return operations


def _diff(old: Any, new: Any, path: str, out: list[Operation]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old:
            if key not in new:
                out.append({"op": "remove", "path": f"{path}/{pointer_token(key)}"})
        for key, value in new.items():
            where = f"{path}/{pointer_token(key)}"
            if key not in old:
                out.append({"op": "add", "path": where, "value": value})
            else:
                _diff(old[key], value, where, out)
    elif isinstance(old, list) and isinstance(new, list):
        _diff_list(old, new, path, out)
    elif not equal(old, new):
        out.append({"op": "replace", "path": path, "value": new})


def _diff_list(old: list[Any], new: list[Any], path: str, out: list[Operation]) -> None:
    common = min(len(old), len(new))
    for index in range(common):
        _diff(old[index], new[index], f"{path}/{index}", out)
    out.extend({"op": "add", "path": f"{path}/{index}", "value": new[index]} for index in range(common, len(new)))
    out.extend({"op": "remove", "path": f"{path}/{index}"} for index in reversed(range(common, len(old))))
