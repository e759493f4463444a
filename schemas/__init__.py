"""The wire contract of koordbus: msgspec event types, shared value types and Koordinator's vocabulary.

Everything here is pure data and pure functions. It imports nothing else of ours, so every
other layer (bus, services, agent, the CLI) can depend on it.
"""
