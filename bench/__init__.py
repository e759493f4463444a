"""Reproducible benchmarks (`make bench`); each script prints one JSON line of results on stdout.

`nodemetric_ingest` is the entry point; `loadgen` (the load-generator processes) and `measure` (parsing the
service's /metrics and /proc, the verdict) are its helpers, imported by it and by tests/e2e/test_bench_smoke.py.
"""
