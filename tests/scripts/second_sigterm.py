"""A rank that sleeps and, once SIGTERM came, sends itself a second one while its main thread
handles the first: at the ``SECOND_SIGTERM_AT``-th line of rankguard's code that the main thread
runs from then on (the Python handler of that second signal runs before ``os.kill`` returns,
there). A launcher that signals a rank's process group, then its process, sends two, which land
apart when it is preempted between them. Says on stderr where it sent the second one."""
import os
import signal
import sys
import time

import rankguard

PACKAGE = os.path.dirname(rankguard.__file__)
AT = int(os.environ["SECOND_SIGTERM_AT"])
lines = 0


def _line(frame, event, arg):
    global lines
    if event == "line":
        lines += 1
        if lines == AT:
            where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
            os.write(2, f"second SIGTERM at {where}\n".encode())
            os.kill(os.getpid(), signal.SIGTERM)
    return _line


def _call(frame, event, arg):
    return _line if frame.f_code.co_filename.startswith(PACKAGE) else None


sys.settrace(_call)  # this thread's only: the main thread, which runs nothing else until SIGTERM
print("sleeping", flush=True)
time.sleep(60)
