"""The node agent: collects node, pod and container usage and (later) applies QoS settings on its node."""
