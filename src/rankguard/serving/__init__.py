"""Serving: ``rankguard.Pool`` (a leader and a group of rank processes that run each request
together, healing itself after a fault) and ``rankguard serve`` (an HTTP server in front of a
pool)."""
