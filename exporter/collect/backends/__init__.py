"""Vendor backends, one package each, and their shared contract (``base``) and guarded
library call (``calls``). The table of backends an operator switches is
exporter.collect.registry."""
