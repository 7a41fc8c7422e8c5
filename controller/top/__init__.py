"""`dra-controller top`: how busy each claimed GPU is, read from the node plugins' Prometheus endpoints.

`metricnames` holds the metric and label names it reads (the usage metrics contract of the
node plugin), `sources` finds and scrapes the endpoints, `snapshot` turns exposition text into
one row per claimed device, `table` sorts (most waste first), filters and renders them,
`command` is the subcommand.
"""
