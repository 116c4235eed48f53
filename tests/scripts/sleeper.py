"""Sleeps for argv[1] seconds (default 600) without torch: a rank that is simply alive."""
import sys
import time

print("sleeping", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 600)
