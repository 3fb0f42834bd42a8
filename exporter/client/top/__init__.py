"""``gpu-exporter top`` on one daemon: the poller and command (``command``), the state
and keys (``model``), the panels (``panels``) and the screen (``screen``)."""
