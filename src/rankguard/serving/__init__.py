"""Serving: ``rankguard.Pool`` (a leader and a replica of rank processes that run each request
together on one gloo group, or NCCL on GPUs, healing itself from spare replicas after a fault)
and ``rankguard serve`` (an HTTP server in front of a pool)."""
