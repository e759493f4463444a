"""The Kubernetes bridge: the only package that imports kubernetes_asyncio.

Its observing half lists and watches Nodes, Pods and the slo-controller-config ConfigMap and publishes them as
state-transfer events (schemas.cluster) on last-value subjects: `core` holds the reflector's pure decisions,
`watch` the list/watch loop, `observer` the wiring to the bus, `client` the ApiClient construction. Started by the
composition root (koordbus); tested against the fake API server in tests/fakes.
"""
