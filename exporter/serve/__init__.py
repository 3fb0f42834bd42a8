"""Serving: the HTTP server, its connection slots, web config and middleware, the live
page, its history and the snapshot's JSON view."""
