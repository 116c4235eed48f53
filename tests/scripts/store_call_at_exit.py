"""A process whose script ends while a helper thread's store call, bounded by 2 s, is still in
torch: a wait on a real TCPStore that times out 0.5 s later, during the interpreter's exit.
``store_call_at_exit.py unregistered`` leaves the call out of ``exit_waits`` (as before it).
Prints ``ended`` when its script ends; exits 0 unless the process aborts.

The interpreter's finalization is held open for 1.5 s (a module global whose ``__del__``
sleeps): how long it takes otherwise depends on the machine (under 0.4 s on a fast one, which
exited before the call came back, so the fault did not show)."""
import sys
import threading
import time
from datetime import timedelta

from torch.distributed import TCPStore

from rankguard import exit_waits
from rankguard.deadline import Deadline
from rankguard.store import store_calls



class _HoldsFinalizationOpen:
    def __del__(self, sleep=time.sleep) -> None:
        sleep(1.5)


_held_open = _HoldsFinalizationOpen()

if sys.argv[1:] == ["unregistered"]:
    exit_waits.finish_before_exit = lambda thread, limit: None

server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
client = TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))


def notice() -> None:
    try:
        store_calls.within(Deadline.after(2.0), "a notice",
                           lambda: client.wait(["never"], timedelta(seconds=0.5)))
    except RuntimeError:  # torch's timeout: the call came back
        pass


threading.Thread(target=notice, daemon=True).start()
time.sleep(0.1)
print("ended", flush=True)
