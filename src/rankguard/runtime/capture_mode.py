"""rankguard's threads and CUDA graph captures: each thread that reads torch's NCCL Flight
Recorder entries runs in CUDA's thread-local stream capture mode.

Reading an entry that has not completed queries its CUDA events (torch's recorder does, to
report its state). torch captures CUDA graphs in ``cudaStreamCaptureModeGlobal`` by default:
while one thread captures, a *potentially unsafe* CUDA call from any other thread in global
mode, an event query among them, fails and invalidates that capture. torch's own watchdog
thread queries its events under a thread-local mode for that reason
(``CUDAStreamCaptureModeGuard``); rankguard's sampler, abort and teardown threads do the same,
once each, through the CUDA runtime library torch loaded. Their queries then never break a
capture of the user's, and the user's capture never fails their reads.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading

_THREAD_LOCAL = 1  # cudaStreamCaptureModeThreadLocal (cudaStreamCaptureModeGlobal is 0)
_done = threading.local()


def thread_local_for_this_thread() -> bool:
    """Put the calling thread in ``cudaStreamCaptureModeThreadLocal``, once per thread.

    Does nothing (returns False) where torch has not initialised CUDA in this process (no CUDA
    runtime call is made then: it could initialise the driver in a process that forks later)
    or no CUDA runtime library is loaded; returns whether the thread is in that mode. Never
    raises.
    """
    if getattr(_done, "mode_set", False):
        return True
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return False
    except Exception:  # noqa: BLE001 (a torch without CUDA, half imported...: not ours to fix)
        return False
    runtime = _cuda_runtime()
    if runtime is None:
        return False
    mode = ctypes.c_int(_THREAD_LOCAL)
    _done.mode_set = runtime.cudaThreadExchangeStreamCaptureMode(ctypes.byref(mode)) == 0
    return bool(_done.mode_set)


@functools.cache
def _cuda_runtime() -> ctypes.CDLL | None:
    """The CUDA runtime library this process loaded (torch's, whichever CUDA version), or
    None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = [line.split(None, 5)[-1].strip() for line in maps if "/libcudart" in line]
    except OSError:
        return None
    for path in dict.fromkeys(paths):
        try:
            runtime = ctypes.CDLL(path)  # already loaded: the same handle, no second copy
            runtime.cudaThreadExchangeStreamCaptureMode.argtypes = [ctypes.POINTER(ctypes.c_int)]
            runtime.cudaThreadExchangeStreamCaptureMode.restype = ctypes.c_int
            return runtime
        except (OSError, AttributeError):
            continue
    return None
