"""The error every `koordbus calc` calculator raises for malformed input (shared by koordbus.calc and its parts)."""

from __future__ import annotations


class InputError(ValueError):
    """Malformed input; the message starts with the JSON path of the offending field."""
