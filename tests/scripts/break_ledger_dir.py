"""In attempt 0, rank 0 removes the run's private ledger folder, then crashes: the launcher
cannot create the next attempt's ledgers (an error of its own, with the log dir intact)."""
import os
import shutil

if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "0":
    shutil.rmtree(os.path.dirname(os.environ["RANKGUARD_LEDGER"]))
    os._exit(1)
import time

time.sleep(600)
