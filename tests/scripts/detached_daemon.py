"""Starts ``sleep 1000`` detached the hard way: a cleared environment (``env -i``: no marker of
the run or the test), a session of its own (``setsid``), orphaned (its parent shell exits).
Writes its pid to argv[1] (atomically), then sleeps argv[2] seconds (default 0)."""
import os
import subprocess
import sys
import time

DETACH = "setsid env -i sleep 1000 </dev/null >/dev/null 2>&1 & echo $!"
pid = subprocess.run(["sh", "-c", DETACH], capture_output=True, text=True, check=True,
                     timeout=30).stdout.strip()
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(pid)
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
print(f"started {pid}", flush=True)
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)
