"""The event backbone: the only package that imports nats.

`bus.api` defines the interface every service codes against (Bus, Handler, the specs);
`bus.jetstream` implements it on NATS JetStream and `bus.memory` in process, and both pass
the same contract suite (tests/bus). `bus.subjects` and `bus.streams` name what flows where.
"""
