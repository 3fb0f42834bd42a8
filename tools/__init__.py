"""Generators of the committed docs (``python -m tools.metricsdoc``, ``python -m
tools.flagsdoc``); run from a checkout, never shipped in the wheel."""
