"""A rank without torch that tells the test where its ledger is: writes ``RANKGUARD_LEDGER``
into ``argv[1]``.rank<R> (by a rename), then sleeps ``argv[2]`` seconds (default 0)."""
import os
import sys
import time

target = f"{sys.argv[1]}.rank{os.environ['RANK']}"
with open(target + ".tmp", "w") as f:
    f.write(os.environ["RANKGUARD_LEDGER"])
os.rename(target + ".tmp", target)
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)
