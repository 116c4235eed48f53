"""A rank that says "ready" on stdout, then holds the GIL in one C call (a builtin ``sum`` over a
range, which never releases it) for as long as it lives."""

print("ready", flush=True)
sum(range(10**15))
