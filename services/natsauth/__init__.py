"""The NATS auth callout: node agents connect with their Kubernetes ServiceAccount token and get a NATS user
allowed to act only as their node (see service.py)."""
