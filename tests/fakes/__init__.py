"""In-process stand-ins for external systems that cannot run on test machines (a Kubernetes API server)."""
