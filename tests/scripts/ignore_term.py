"""Every rank ignores SIGTERM and starts a grandchild; rank 1 then crashes (unless
RANK_NEVER_CRASH is set)."""
import os
import signal
import subprocess
import sys
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
time.sleep(0.5)
print("started", flush=True)
if os.environ["RANK"] == "1" and not os.environ.get("RANK_NEVER_CRASH"):
    os._exit(5)
time.sleep(600)
