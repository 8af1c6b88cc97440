"""Settings of the serving process itself, made by `App.serve` (the process is the server's; an application
that embeds the App and calls `start` keeps its own): the open-file limit and the garbage collector."""
from __future__ import annotations

import gc

GC_GEN0_THRESHOLD = 20_000  # allocations between two collections of the youngest generation (default 700)


def raise_open_file_limit(wanted: int) -> None:
    """Every connection is a file descriptor: lift the soft limit towards the hard one if needed."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):  # not on this platform, or not allowed: keep going
        pass


def tune_gc() -> None:
    """Once start-up is done: what it built (modules, sessions, configs) moves out of the collector's way
    (`gc.freeze`), and the youngest generation is collected every GC_GEN0_THRESHOLD allocations instead of
    700. A request allocates a few hundred short-lived objects; with the defaults the collector took ~6 %
    of the server's CPU at 64 clients, most of it walking long-lived objects in the older generations
    (perf record of bench/perf_sweep.py's mlp point, issue #17)."""
    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gen0, GC_GEN0_THRESHOLD), gen1, gen2)
