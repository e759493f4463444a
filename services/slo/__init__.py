"""NodeSLO (spec §7.1): rendering each node's spec from the slo-controller-config keys; the service builds on it."""
