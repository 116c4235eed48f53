"""In attempt 0, once rank 1 runs this script (its stacks file open), rank 0 puts a file where
the launcher's log dir (argv[1]) was, then crashes: the launcher cannot create the next
attempt's folder."""
import os
import sys
import time

log_dir = sys.argv[1]
started = log_dir + ".rank1"  # rank 1 is past its start-up, which opens files in the log dir
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "1":
    open(started, "w").close()
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "0":
    deadline = time.monotonic() + 60
    while not os.path.exists(started) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.rename(log_dir, log_dir + ".moved")
    with open(log_dir, "w") as f:
        f.write("not a folder\n")
    os._exit(1)

time.sleep(600)
