"""Koordinator's shared vocabulary (spec §0): priority classes, QoS classes and extended resource names.

Used by the node agent (to label what it collects), by nodemetric (podsMetric priority/qos)
and by every later calculation that splits pods into prod / mid / batch / free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

PRIORITY_CLASS_LABEL: Final = "koordinator.sh/priority-class"
QOS_CLASS_LABEL: Final = "koordinator.sh/qosClass"

PRIORITY_PROD: Final = "koord-prod"
PRIORITY_MID: Final = "koord-mid"
PRIORITY_BATCH: Final = "koord-batch"
PRIORITY_FREE: Final = "koord-free"
PRIORITY_NONE: Final = ""

# class -> (lowest value, highest value, default value)
PRIORITY_RANGES: Final[Mapping[str, tuple[int, int, int]]] = {
    PRIORITY_PROD: (9000, 9999, 9500),
    PRIORITY_MID: (7000, 7999, 7500),
    PRIORITY_BATCH: (5000, 5999, 5500),
    PRIORITY_FREE: (3000, 3999, 3500),
}

QOS_LSE: Final = "LSE"
QOS_LSR: Final = "LSR"
QOS_LS: Final = "LS"
QOS_BE: Final = "BE"
QOS_SYSTEM: Final = "SYSTEM"
QOS_NONE: Final = ""
KOORD_QOS_CLASSES: Final = frozenset({QOS_LSE, QOS_LSR, QOS_LS, QOS_BE, QOS_SYSTEM})

KUBE_QOS_GUARANTEED: Final = "Guaranteed"
KUBE_QOS_BURSTABLE: Final = "Burstable"
KUBE_QOS_BESTEFFORT: Final = "BestEffort"

# Koordinator maps Guaranteed to LSR (variable QoSClassForGuaranteed), not LS as many docs say.
_QOS_FROM_KUBE: Final[Mapping[str, str]] = {
    KUBE_QOS_GUARANTEED: QOS_LSR,
    KUBE_QOS_BURSTABLE: QOS_LS,
    KUBE_QOS_BESTEFFORT: QOS_BE,
}

BATCH_CPU: Final = "kubernetes.io/batch-cpu"
BATCH_MEMORY: Final = "kubernetes.io/batch-memory"
MID_CPU: Final = "kubernetes.io/mid-cpu"
MID_MEMORY: Final = "kubernetes.io/mid-memory"


def priority_class_from_value(priority: int | None) -> str:
    """The class whose range holds `priority`; None or out of every range gives the empty class."""
    if priority is None:
        return PRIORITY_NONE
    for name, (low, high, _default) in PRIORITY_RANGES.items():
        if low <= priority <= high:
            return name
    return PRIORITY_NONE


def raw_priority_class(labels: Mapping[str, str], priority: int | None) -> str:
    """The pod's class from its label when present (unknown label values give None), else from spec.priority."""
    if PRIORITY_CLASS_LABEL in labels:
        value = labels[PRIORITY_CLASS_LABEL]
        return value if value in PRIORITY_RANGES else PRIORITY_NONE
    return priority_class_from_value(priority)


def qos_class_with_default(labels: Mapping[str, str], kube_qos: str) -> str:
    """The koordinator QoS label when it names a known class, else the class mapped from the kube QoS."""
    value = labels.get(QOS_CLASS_LABEL, "")
    if value in KOORD_QOS_CLASSES:
        return value
    return _QOS_FROM_KUBE.get(kube_qos, QOS_NONE)


def priority_class_with_default(labels: Mapping[str, str], priority: int | None, kube_qos: str) -> str:
    """The raw class, or when that is None the class implied by the QoS (prod for SYSTEM/LSE/LSR/LS, batch for BE)."""
    raw = raw_priority_class(labels, priority)
    if raw != PRIORITY_NONE:
        return raw
    qos = qos_class_with_default(labels, kube_qos)
    if qos in (QOS_SYSTEM, QOS_LSE, QOS_LSR, QOS_LS):
        return PRIORITY_PROD
    if qos == QOS_BE:
        return PRIORITY_BATCH
    return PRIORITY_NONE


def priority_value_with_default(labels: Mapping[str, str], priority: int | None, kube_qos: str) -> int:
    """spec.priority when set and non-zero, else the default value of the pod's class (0 for None)."""
    if priority:
        return priority
    klass = priority_class_with_default(labels, priority, kube_qos)
    return PRIORITY_RANGES[klass][2] if klass in PRIORITY_RANGES else 0
