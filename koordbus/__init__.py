"""The composition root: the `koordbus` command wires buses, stores and services together."""

__version__ = "0.1.0"
