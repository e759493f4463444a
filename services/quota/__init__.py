"""Elastic quota trees (spec §3). Pure: core.py (the event-sourced aggregate: commands decided into events, folded
into QuotaTreeState), model.py (the service's whole model: the trees, the pods, one runtime tree per tree id) and the
calculations it is built from (runtime, distribute, recompute, pods, admission, profiles, validation); the I/O
shells: service.py, store.py, client.py."""
