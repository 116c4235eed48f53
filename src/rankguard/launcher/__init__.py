"""The launcher (``rankguard run``): starts ranks, detects faults and hangs, tears down, restarts."""
