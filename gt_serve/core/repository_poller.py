"""Triton's `poll` model control mode: every `interval_s` the repository is rescanned; a new model directory
is loaded, a model whose files changed is reloaded, a model whose directory went away is unloaded.

Change is seen in a fingerprint of the model directory: (relative path, size, mtime_ns) of every file in it,
its version directories and one level below them (bounded in count). A reload is the registry's
load-new-then-swap: requests keep being served by the old versions until the new ones are READY, and a
model that fails to reload keeps serving its old versions (the registry keeps them). A failed load is
retried only when the model's files change again, as Triton does.
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from ..errors import GtServeError
from .registry import ModelRegistry

log = logging.getLogger(__name__)

MAX_FINGERPRINT_ENTRIES = 10_000  # files and directories looked at per model directory
_DEPTH = 3  # NAME/file, NAME/VERSION/file, NAME/VERSION/dir/file (a model split over external data files)

Fingerprint = frozenset


def fingerprint(model_dir: Path) -> Fingerprint:
    """(relative path, size, mtime_ns) of the entries under `model_dir`, down to _DEPTH levels; symlinks are
    followed for their size and time, never walked into."""
    entries = []
    pending = [(Path(model_dir), 0)]
    while pending and len(entries) < MAX_FINGERPRINT_ENTRIES:
        directory, depth = pending.pop()
        try:
            children = list(os.scandir(directory))
        except OSError:
            continue
        for child in children[:MAX_FINGERPRINT_ENTRIES - len(entries)]:
            try:
                st = child.stat()
            except OSError:  # a dangling link, or removed while we looked
                continue
            entries.append((os.path.relpath(child.path, model_dir), st.st_size, st.st_mtime_ns))
            if depth + 1 < _DEPTH and child.is_dir(follow_symlinks=False):
                pending.append((Path(child.path), depth + 1))
    return frozenset(entries)


class RepositoryPoller:
    """Owns the fingerprints of what was last loaded; `poll_once` brings the registry in line with the
    repository, `run` does so every `interval_s` until cancelled."""

    def __init__(self, registry: ModelRegistry, interval_s: float,
                 refresh: Callable[[], Awaitable[None]] | None = None) -> None:
        """`refresh`: brings the repositories' local copies up to date before each pass (edge/remote_repository.py)."""
        if not interval_s > 0:
            raise ValueError(f"repository poll interval must be positive, got {interval_s!r}")
        self._registry = registry
        self._refresh = refresh
        self.interval_s = interval_s
        self._seen: dict[str, tuple[Fingerprint, ...]] = {}
        self.polls = 0

    async def baseline(self) -> None:
        """Record the repository as the start-up loads found it (those models are not reloaded)."""
        self._seen = await asyncio.to_thread(self._fingerprints)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.poll_once()
            except Exception:  # the poller must outlive one bad pass (a vanished directory, a full disk)
                log.exception("repository poll failed")

    async def poll_once(self) -> dict[str, list[str]]:
        """One pass; returns {"loaded": [...], "reloaded": [...], "unloaded": [...], "failed": [...]}."""
        done: dict[str, list[str]] = {"loaded": [], "reloaded": [], "unloaded": [], "failed": []}
        if self._refresh is not None:
            try:
                await self._refresh()
            except GtServeError as exc:  # a bucket that cannot be read: no pass this time, what is loaded serves on
                log.error("repository poll: %s", exc)
                return done
        now = await asyncio.to_thread(self._fingerprints)
        for name in sorted(self._registry.repository_models()):
            if name not in now:
                await self._registry.unload(name)
                done["unloaded"].append(name)
        for name, print_ in sorted(now.items()):
            if self._seen.get(name) == print_:
                continue
            self._seen[name] = print_
            kind = "reloaded" if self._registry.is_loaded(name) else "loaded"
            if len(print_) > 1 and kind == "reloaded":  # a second copy appeared: as Triton, the one serving goes
                await self._registry.unload(name, reason="a second copy appeared in the model repositories")
                done["unloaded"].append(name)  # and its load below fails, naming the copies' count
            try:
                await self._registry.load(name)
            except Exception as exc:  # logged once; old versions (if any) keep serving
                log.error("repository poll: %s", exc)
                done["failed"].append(name)
                continue
            done[kind].append(name)
        for name in set(self._seen) - set(now):
            del self._seen[name]
        self.polls += 1
        if any(done.values()):
            log.info("repository poll: %s", ", ".join(f"{k} {','.join(v)}" for k, v in done.items() if v))
        return done

    def _fingerprints(self) -> dict[str, tuple[Fingerprint, ...]]:
        """Each model's, of its directory in each repository that has one (a second copy appearing or going is a
        change: the model is loaded again, and fails or serves as the repositories now say)."""
        return {name: tuple(map(fingerprint, self._registry.model_dirs(name))) for name in self._registry.scan()}
