"""Clients: ``gpu-exporter top`` on one daemon (``top``), the fleet view over Prometheus
(``fleet``), the terminal loop both draw on (``terminal``) and the HTTP fetch behind
``top`` and ``snapshot --from`` (``fetch``). Inside: fetch and terminal < top < fleet."""
