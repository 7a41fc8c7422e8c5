"""How busy each claimed device is: NVML sampling, per-claim attribution, idle claims.

`names` holds every metric name (the one source of truth; `docs` renders
docs/metrics.md from it); `nvmlsource` and `fakesource` read a device into a
`reading`; `attribution` ties a PID to its pod and container, `holders` a
device to its claims and their pods, `split` a device's figures to those
holders; `idle` decides which claims are idle; `sampler` runs the passes on
its own threads; `exporter` serves the latest pass; `wiring` builds it all
for `draplugin run`.
"""
