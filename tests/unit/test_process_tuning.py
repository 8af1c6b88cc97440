"""gt_serve.execution.process_tuning: the serving process's collector settings (in a child process: they are
process-wide)."""
from __future__ import annotations

import subprocess
import sys

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
