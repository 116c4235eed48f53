"""In attempt 0, rank 0 puts a file where the launcher's log dir (argv[1]) was, then crashes:
the launcher cannot create the next attempt's folder."""
import os
import sys

log_dir = sys.argv[1]
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "0":
    os.rename(log_dir, log_dir + ".moved")
    with open(log_dir, "w") as f:
        f.write("not a folder\n")
    os._exit(1)
import time

time.sleep(600)
