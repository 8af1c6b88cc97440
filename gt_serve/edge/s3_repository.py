"""Model repositories in S3-compatible object storage, as Triton takes them: `--model-repository s3://bucket/path`
(AWS), `s3://host:port/bucket/path` or `s3://https://host:port/bucket/path` (MinIO, Ceph and the like: http unless
https is given), credentials from the usual AWS sources (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
AWS_SESSION_TOKEN, AWS_DEFAULT_REGION, ~/.aws, an instance role; AWS_ENDPOINT_URL for an endpoint not in the URL).

The server reads a local directory: `S3Mirror` keeps one in step with the bucket's prefix. `sync` lists the objects
(ListObjectsV2), downloads those new or changed since its last look (size and ETag) and removes the files of objects
gone; each file is written beside its final name, hidden, and renamed into place, so a scan never reads half a file,
and its mtime is the download's, so the poller's fingerprints (size, mtime) change exactly when a file was fetched
again (an object's LastModified has whole seconds: a same-size replacement within one would go unseen). The
server syncs before its start-up loads (after its listeners are up), before each repository poll, and before each
load request, as Triton localizes a model on each load. A key that would leave the mirror (`..`, an absolute path)
is skipped with a warning. boto3 is the `s3` extra: imported only when such a repository is given."""
from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..errors import Unavailable

log = logging.getLogger(__name__)

SCHEME = "s3://"
_WITH_ENDPOINT = re.compile(r"^s3://(https?://)?([0-9A-Za-z.\-]+):([0-9]+)/(.*)$")  # Triton's host:port form
_PART = ".gt_part-"  # a download in progress: a hidden name, which no scan takes for a model or a version


def is_s3(location: str) -> bool:
    return location.startswith(SCHEME)


@dataclass(frozen=True)
class S3Location:
    url: str
    endpoint: str | None  # None: AWS (or AWS_ENDPOINT_URL)
    bucket: str
    prefix: str  # without slashes at either end; "" = the whole bucket


def parse_s3_url(url: str) -> S3Location:
    """Triton's forms of an S3 repository path; ValueError naming the URL for anything else."""
    match = _WITH_ENDPOINT.match(url)
    if match:
        endpoint, rest = f"{match[1] or 'http://'}{match[2]}:{match[3]}", match[4]
    elif is_s3(url):
        endpoint, rest = None, url[len(SCHEME):]
    else:
        raise ValueError(f"'{url}' is not an s3:// URL")
    bucket, _, prefix = rest.partition("/")
    if not bucket or "://" in rest:
        raise ValueError(f"model repository '{url}': expected s3://bucket/path or s3://host:port/bucket/path")
    return S3Location(url, endpoint, bucket, prefix.strip("/"))


def _client(location: S3Location):
    try:
        import boto3
    except ImportError:
        raise SystemExit(f"gt-serve: model repository '{location.url}' needs boto3: pip install 'gt-serve[s3]'") \
            from None
    return boto3.session.Session().client("s3", endpoint_url=location.endpoint)


def _relative(key: str, prefix: str) -> str | None:
    """The object's path under the mirror, or None: outside the prefix, a directory marker's own name, or a path
    that would leave the mirror."""
    rel = key[len(prefix) + 1:] if prefix else key
    if prefix and not key.startswith(prefix + "/") or not rel:
        return None
    parts = PurePosixPath(rel).parts
    if rel.startswith("/") or "\\" in rel or any(p in ("..", ".") for p in parts):
        log.warning("model repository: object '%s' is skipped: its key leaves the repository", key)
        return None
    return rel


class S3Mirror:
    """A local directory (`root`) kept in step with an S3 repository; `sync` is blocking (run it off the loop)."""

    def __init__(self, location: S3Location, root: Path, client=None) -> None:
        self.location = location
        self.root = root
        self._client = client
        self._have: dict[str, tuple[int, str]] = {}  # relative path -> (size, ETag) of the object downloaded

    def sync(self) -> tuple[int, int]:
        """Bring the mirror in line with the bucket; returns (files downloaded, files removed)."""
        if self._client is None:
            self._client = _client(self.location)
        remote = self._listing()
        fetched = 0
        for rel, (size, etag, is_dir) in remote.items():
            if is_dir:
                (self.root / rel).mkdir(parents=True, exist_ok=True)
            elif self._have.get(rel) != (size, etag) or not (self.root / rel).is_file():
                self._fetch(rel)
                self._have[rel] = (size, etag)
                fetched += 1
        gone = [rel for rel in self._have if rel not in remote]
        for rel in gone:
            del self._have[rel]
            (self.root / rel).unlink(missing_ok=True)
        self._prune(remote)
        if fetched or gone:
            log.info("model repository %s: %d file(s) downloaded, %d removed", self.location.url, fetched, len(gone))
        return fetched, len(gone)

    def _listing(self) -> dict[str, tuple[int, str, bool]]:
        loc = self.location
        listed: dict[str, tuple[int, str, bool]] = {}
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=loc.bucket, **({"Prefix": loc.prefix + "/"} if loc.prefix else {}))
        for page in pages:
            for obj in page.get("Contents", ()):
                rel = _relative(obj["Key"], loc.prefix)
                if rel is not None:
                    is_dir = rel.endswith("/")  # an empty directory's marker (an ensemble's `NAME/1/`)
                    listed[rel.rstrip("/")] = (obj["Size"], obj.get("ETag", ""), is_dir)
        return listed

    def _fetch(self, rel: str) -> None:
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(_PART + target.name)
        self._client.download_file(self.location.bucket, f"{self.location.prefix}/{rel}".lstrip("/"), str(part))
        os.replace(part, target)

    def _prune(self, remote: dict) -> None:
        """Directories left empty by removed objects go too, but for those the bucket marks."""
        kept = {rel for rel, entry in remote.items() if entry[2]}
        for path in sorted(self.root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            rel = path.relative_to(self.root).as_posix()
            if path.is_dir() and rel not in kept and not any(path.iterdir()):
                path.rmdir()
            elif path.name.startswith(_PART):  # a download an earlier sync did not finish
                path.unlink(missing_ok=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class RepositoryMirrors:
    """The s3:// repositories among a server's, each mirrored in a temporary directory of its own; `refresh` syncs
    them all, one sync at a time (start-up, each poll, each load request), off the event loop."""

    def __init__(self, locations: Sequence[str]) -> None:
        try:
            parsed = [parse_s3_url(loc) for loc in locations if is_s3(loc)]
        except ValueError as exc:
            raise SystemExit(f"gt-serve: {exc}") from None
        self._mirrors = {loc.url: S3Mirror(loc, Path(tempfile.mkdtemp(prefix="gt_serve_s3_"))) for loc in parsed}
        self._lock = asyncio.Lock()

    def __bool__(self) -> bool:
        return bool(self._mirrors)

    def local_paths(self, locations: Sequence[str]) -> list[Path]:
        return [self._mirrors[loc].root if loc in self._mirrors else Path(loc) for loc in locations]

    async def refresh(self) -> None:
        """Unavailable naming the repository when one cannot be read (the loaded models keep serving)."""
        async with self._lock:
            for url, mirror in self._mirrors.items():
                try:
                    await asyncio.to_thread(mirror.sync)
                except (SystemExit, asyncio.CancelledError):
                    raise
                except Exception as exc:  # noqa: BLE001 - boto3's and the disk's errors alike
                    raise Unavailable(f"model repository '{url}' cannot be read: {type(exc).__name__}: {exc}") \
                        from None

    def close(self) -> None:
        for mirror in self._mirrors.values():
            mirror.close()
