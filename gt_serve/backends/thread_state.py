"""Keep the Python thread state of a foreign thread that calls back into Python again and again.

onnxruntime's `run_async` calls its Python callback on a thread of the session's intra-op pool. pybind11 takes
the GIL there with a thread state made for the call and deleted after it, and CPython (3.11 and later) gives each
new thread state its first 16 KiB of frame stack with mmap and frees it with munmap. An munmap in a process whose
threads run on several CPUs flushes the other CPUs' TLBs by interrupt; on a virtual machine each interrupt is an
exit to the hypervisor. Per launched run that cost the pool thread ~0.05 ms of kernel time (an mlp batch-1 run:
~0.30 ms of the pool thread's CPU where raw onnxruntime's is ~0.20; issue #17, twenty-sixth pass).

`keep_thread_state()`, called at the start of such a callback, takes one more hold of the thread state with
PyGILState_Ensure and never gives it back: pybind11 then finds it in place and leaves it alive when the callback
returns, and the next callback on that thread uses it again. At most `KEPT_MAX` threads are kept in a process: a
kept thread state (~20 KiB) stays until the interpreter ends even after its thread has ended (a session closed on
a model's unload or reload takes its pool threads with it), so reloads cannot grow memory without bound; past
that, callbacks pay the mmap again, nothing else changes.
"""
from __future__ import annotations

import ctypes
import threading

KEPT_MAX = 64
_kept = threading.local()  # per thread state: what a kept one remembers between callbacks
_kept_count = 0


def keep_thread_state() -> None:
    """On the calling thread (with the GIL held): keep its Python thread state from now on, once, if fewer than
    `KEPT_MAX` are kept."""
    global _kept_count
    if getattr(_kept, "kept", False) or _kept_count >= KEPT_MAX:
        return
    ctypes.pythonapi.PyGILState_Ensure()
    _kept.kept = True
    _kept_count += 1


def kept_count() -> int:
    """How many threads' states are kept in this process."""
    return _kept_count
