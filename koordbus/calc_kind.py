"""What one `koordbus calc` kind is: its input type, its computation, and its `--help` summary and example.

koordbus.calc lists the kinds; a kind's module may build its own Calculator next to its code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Calculator:
    input_type: type[Any]
    compute: Callable[[Any], dict[str, Any]]
    summary: str
    example: str
