"""Elastic quota trees (spec §3): the pure runtime calculation now; validation, the service and the API build on it."""
