"""gpu-exporter: one Prometheus view of every GPU on a machine, whatever the vendor."""

__version__ = "0.1.0"
