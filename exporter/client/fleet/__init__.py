"""``gpu-exporter top --prometheus``, the fleet read back from Prometheus: the HTTP API
client (``promapi``), the PromQL (``ql``), the typed node list (``nodes``), the flags'
defaults (``flags``), the state and keys (``model``), the screen and the command."""
