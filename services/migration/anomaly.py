"""Koordinator's anomaly BasicDetector (pkg/descheduler/utils/anomaly) as the LowNodeLoad round uses it (spec §11.5).
Pure: the clock is the `now` each call is given (Unix seconds).

A detector is ok or anomaly. In ok, each abnormal mark counts; when the consecutive abnormal count goes above
`consecutive_abnormalities` it enters anomaly, which clears the counters and lasts `timeout` (≤ 0 → 60 s, never
extended by further abnormal marks). Anomaly ends when the timeout has passed (strictly before now) or when the
consecutive normal count goes above `consecutive_normalities`. `reset` returns it to ok with clear counters.
`filter_abnormal` is the plugin's filterRealAbnormalNodes: with `consecutiveAbnormalities == 1` every node is
abnormal and no detector is kept; otherwise each node's detector (created on first sight) gets one abnormal mark.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

OK: Final = "ok"
ANOMALY: Final = "anomaly"
DEFAULT_TIMEOUT_SECONDS: Final = Fraction(60)


@dataclass
class Detector:
    consecutive_abnormalities: int
    consecutive_normalities: int
    timeout_seconds: Fraction = DEFAULT_TIMEOUT_SECONDS
    state: str = OK
    abnormal: int = 0
    """Consecutive abnormal marks in this generation."""
    normal: int = 0
    """Consecutive normal marks in this generation."""
    anomaly_until: Fraction | None = None

    def effective_timeout(self) -> Fraction:
        return self.timeout_seconds if self.timeout_seconds > 0 else DEFAULT_TIMEOUT_SECONDS

    def _set_state(self, state: str, now: Fraction) -> None:
        if self.state == state:
            return
        self.state = state
        self.abnormal = self.normal = 0
        self.anomaly_until = now + self.effective_timeout() if state == ANOMALY else None

    def current_state(self, now: Fraction) -> str:
        if self.state == ANOMALY:
            expired = self.anomaly_until is not None and self.anomaly_until < now
            if expired or self.normal > self.consecutive_normalities:
                self._set_state(OK, now)
        return self.state

    def mark(self, normal: bool, now: Fraction) -> str:
        state = self.current_state(now)
        if normal:
            self.normal += 1
            self.abnormal = 0
            if state == ANOMALY and self.normal > self.consecutive_normalities:
                self._set_state(OK, now)
        else:
            self.abnormal += 1
            self.normal = 0
            if state == OK and self.abnormal > self.consecutive_abnormalities:
                self._set_state(ANOMALY, now)
        return self.current_state(now)

    def reset(self, now: Fraction) -> None:
        self._set_state(OK, now)


def filter_abnormal(
    nodes: Iterable[str],
    detectors: MutableMapping[str, Detector],
    abnormalities: int,
    normalities: int,
    timeout_seconds: Fraction,
    now: Fraction,
) -> list[str]:
    """The nodes whose detector is (now) in anomaly after one abnormal mark; all of them when abnormalities == 1."""
    listed = list(nodes)
    if abnormalities == 1:
        return listed
    abnormal = []
    for name in listed:
        detector = detectors.get(name)
        if detector is None:
            detector = detectors[name] = Detector(abnormalities, normalities, timeout_seconds)
        if detector.mark(False, now) == ANOMALY:
            abnormal.append(name)
    return abnormal


def reset_all(nodes: Iterable[str], detectors: MutableMapping[str, Detector], now: Fraction) -> None:
    for name in nodes:
        if name in detectors:
            detectors[name].reset(now)


def mark_normal(nodes: Iterable[str], detectors: MutableMapping[str, Detector], now: Fraction) -> None:
    for name in nodes:
        if name in detectors:
            detectors[name].mark(True, now)
