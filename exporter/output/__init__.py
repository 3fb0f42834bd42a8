"""Outputs: the Prometheus exposition, dcgm-exporter names, OTLP and the generated docs,
each read from a published snapshot through the catalogue."""
