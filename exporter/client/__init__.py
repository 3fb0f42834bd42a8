"""Clients of a running daemon: `gpu-exporter top` and the HTTP fetch behind it and
`snapshot --from`."""
