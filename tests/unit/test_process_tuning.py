"""gt_serve.execution.process_tuning: the serving process's collector settings (in a child process: they are
process-wide)."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from gt_serve.execution.process_tuning import tune_malloc

CHILD = """
import gc
from gt_serve.execution.process_tuning import GC_GEN0_THRESHOLD, tune_gc
before = gc.get_freeze_count()
gc.set_threshold(700, 10, 10)
tune_gc()
print(before, gc.get_freeze_count(), *gc.get_threshold(), GC_GEN0_THRESHOLD)
gc.set_threshold(50_000, 10, 10)
tune_gc()  # a higher threshold set by the host is kept
print(gc.get_threshold()[0])
"""


def test_tune_gc_freezes_start_up_objects_and_raises_only_the_youngest_threshold():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True)
    first, second = out.stdout.split("\n")[:2]
    before, frozen, gen0, gen1, gen2, wanted = map(int, first.split())
    assert before == 0 and frozen > 1000  # the interpreter's and gt_serve's modules at least
    assert (gen0, gen1, gen2) == (wanted, 10, 10) and wanted > 700
    assert int(second) == 50_000


MALLOC_CHILD = """
import resource, sys
from gt_serve.execution.process_tuning import tune_malloc
if sys.argv[1] == "tuned":
    assert tune_malloc({})
def cycle():  # what 16 clients' image-sized requests do to the heap: several blocks of 600 KB, taken and freed
    blocks = [bytearray(600_000) for _ in range(8)]
    for b in blocks:
        b[::4096] = bytes(len(b[::4096]))
cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    cycle()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


glibc_only = pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                                reason="glibc only")


def _child_output(code: str, *args: str) -> str:
    """The last word `code` printed, run in a fresh interpreter with glibc's malloc at its defaults."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, check=True,
                         env=env)
    return out.stdout.split()[-1]


def _faults_per_cycle(mode: str) -> float:
    return float(_child_output(MALLOC_CHILD, mode))


@glibc_only
def test_tune_malloc_keeps_large_blocks_on_the_heap_instead_of_faulting_them_in_again():
    assert _faults_per_cycle("default") > 500  # the heap's top went back to the system and came again
    assert _faults_per_cycle("tuned") < 20


def test_tune_malloc_leaves_an_operators_own_settings_alone():
    assert not tune_malloc({"MALLOC_ARENA_MAX": "2", "MALLOC_TRIM_THRESHOLD_": "0"})
    assert not tune_malloc({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"})


TRIM_CHILD = """
import os
from gt_serve.core.memory_budget import process_rss_bytes
from gt_serve.execution.process_tuning import tune_malloc
def statm():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
assert tune_malloc({})
blocks = [bytearray(600_000) for _ in range(60)]  # 36 MB, written
del blocks  # kept by the heap, still resident
kept = statm()
print(kept - process_rss_bytes())
"""


@glibc_only
def test_a_load_measures_memory_in_use_not_the_freed_heap_the_server_keeps():
    """memory_budget's RSS reading hands freed heap back first: a session made from kept heap must still count."""
    assert int(_child_output(TRIM_CHILD)) > 20_000_000
