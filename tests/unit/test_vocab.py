"""Priority and QoS derivation (spec §0)."""

import pytest

from schemas import vocab


@pytest.mark.parametrize(
    ("priority", "expected"),
    [
        (9000, "koord-prod"),
        (9999, "koord-prod"),
        (7500, "koord-mid"),
        (5999, "koord-batch"),
        (3000, "koord-free"),
        (8999, ""),
        (None, ""),
        (0, ""),
        (10000, ""),
    ],
)
def test_priority_ranges(priority: int | None, expected: str) -> None:
    assert vocab.priority_class_from_value(priority) == expected


def test_label_wins_and_unknown_label_is_none() -> None:
    assert vocab.raw_priority_class({vocab.PRIORITY_CLASS_LABEL: "koord-batch"}, 9500) == "koord-batch"
    assert vocab.raw_priority_class({vocab.PRIORITY_CLASS_LABEL: "gold"}, 9500) == ""


def test_guaranteed_is_lsr_not_ls() -> None:
    assert vocab.qos_class_with_default({}, "Guaranteed") == "LSR"
    assert vocab.qos_class_with_default({}, "Burstable") == "LS"
    assert vocab.qos_class_with_default({}, "BestEffort") == "BE"
    assert vocab.qos_class_with_default({vocab.QOS_CLASS_LABEL: "BE"}, "Guaranteed") == "BE"
    assert vocab.qos_class_with_default({vocab.QOS_CLASS_LABEL: "bogus"}, "Burstable") == "LS"


def test_priority_defaults_follow_qos() -> None:
    assert vocab.priority_class_with_default({}, None, "Guaranteed") == "koord-prod"
    assert vocab.priority_class_with_default({}, None, "BestEffort") == "koord-batch"
    assert vocab.priority_class_with_default({}, None, "") == ""
    assert vocab.priority_value_with_default({}, None, "BestEffort") == 5500
    assert vocab.priority_value_with_default({}, 7100, "BestEffort") == 7100
    assert vocab.priority_value_with_default({}, 0, "") == 0
