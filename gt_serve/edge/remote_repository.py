"""Model repositories in object storage, as Triton takes them:
- S3 and S3-compatible stores: `s3://bucket/path` (AWS), `s3://host:port/bucket/path` or
  `s3://https://host:port/bucket/path` (MinIO, Ceph and the like: http unless https is given); credentials from the
  usual AWS sources (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_DEFAULT_REGION, ~/.aws, an
  instance role; AWS_ENDPOINT_URL for an endpoint not in the URL). boto3: the `s3` extra.
- Google Cloud Storage: `gs://bucket/path`; credentials from Google's application default credentials
  (GOOGLE_APPLICATION_CREDENTIALS, the metadata server; STORAGE_EMULATOR_HOST for an emulator).
  google-cloud-storage: the `gcs` extra.

The server reads a local directory: a `RemoteMirror` keeps one in step with the bucket's prefix. `sync` lists the
objects, downloads those new or changed since its last look (size and ETag) and removes the files of objects gone;
each file is written beside its final name, hidden, and renamed into place, so a scan never reads half a file, and
its mtime is the download's, so the poller's fingerprints (size, mtime) change exactly when a file was fetched again
(an object's modification time may have whole seconds: a same-size replacement within one would go unseen). The
server syncs before its start-up loads (after its listeners are up), before each repository poll, and before each
load request, as Triton localizes a model on each load. A key that would leave the mirror (`..`, an absolute path)
is skipped with a warning. A store's library is imported only when such a repository is given."""
from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import Unavailable

log = logging.getLogger(__name__)

SCHEMES = ("s3://", "gs://")
_S3_ENDPOINT = re.compile(r"^s3://(https?://)?([0-9A-Za-z.\-]+):([0-9]+)/(.*)$")  # Triton's host:port form
_PART = ".gt_part-"  # a download in progress: a hidden name, which no scan takes for a model or a version


def is_remote(location: str) -> bool:
    return location.startswith(SCHEMES)


@dataclass(frozen=True)
class RemoteLocation:
    url: str
    scheme: str  # "s3" or "gs"
    endpoint: str | None  # S3's host:port form; None: the store's default
    bucket: str
    prefix: str  # without slashes at either end; "" = the whole bucket


def parse_remote_url(url: str) -> RemoteLocation:
    """Triton's forms of an object-store repository path; ValueError naming the URL for anything else."""
    match = _S3_ENDPOINT.match(url)
    if match:
        scheme, endpoint, rest = "s3", f"{match[1] or 'http://'}{match[2]}:{match[3]}", match[4]
    elif is_remote(url):
        scheme, endpoint, rest = url[:2], None, url[len("s3://"):]
    else:
        raise ValueError(f"'{url}' is not an s3:// or gs:// URL")
    bucket, _, prefix = rest.partition("/")
    if not bucket or "://" in rest:
        raise ValueError(f"model repository '{url}': expected {scheme}://bucket/path"
                         + (" or s3://host:port/bucket/path" if scheme == "s3" else ""))
    return RemoteLocation(url, scheme, endpoint, bucket, prefix.strip("/"))


class _S3Store:
    def __init__(self, location: RemoteLocation) -> None:
        import boto3

        self._client = boto3.session.Session().client("s3", endpoint_url=location.endpoint)
        self._bucket = location.bucket

    def objects(self, prefix: str) -> Iterator[tuple[str, int, str]]:
        """(key, size, ETag) of each object under `prefix` ("" = all)."""
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self._bucket, **({"Prefix": prefix} if prefix else {}))
        for page in pages:
            for obj in page.get("Contents", ()):
                yield obj["Key"], obj["Size"], obj.get("ETag", "")

    def download(self, key: str, path: str) -> None:
        self._client.download_file(self._bucket, key, path)


class _GcsStore:
    RETRY_S = 30.0  # the library's default retry waited 92 s for a store it could not reach before failing a start

    def __init__(self, location: RemoteLocation) -> None:
        from google.cloud import storage
        from google.cloud.storage.retry import DEFAULT_RETRY

        self._client = storage.Client()
        self._bucket = self._client.bucket(location.bucket)
        self._retry = getattr(DEFAULT_RETRY, "with_timeout", DEFAULT_RETRY.with_deadline)(self.RETRY_S)

    def objects(self, prefix: str) -> Iterator[tuple[str, int, str]]:
        for blob in self._client.list_blobs(self._bucket, prefix=prefix or None, retry=self._retry):
            yield blob.name, blob.size or 0, f"{blob.etag}:{blob.generation}"

    def download(self, key: str, path: str) -> None:
        self._bucket.blob(key).download_to_filename(path, retry=self._retry)


_LIBRARIES = {"s3": ("boto3", "s3"), "gs": ("google.cloud.storage", "gcs")}  # scheme -> (module, extra)


def _check_library(location: RemoteLocation) -> None:
    """SystemExit naming the extra to install, before anything starts, when the store's library is missing."""
    module, extra = _LIBRARIES[location.scheme]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package (google.cloud) missing
        found = False
    if not found:
        raise SystemExit(f"gt-serve: model repository '{location.url}' needs {module.split('.')[0]}: "
                         f"pip install 'gt-serve[{extra}]'")


def _relative(key: str, prefix: str) -> str | None:
    """The object's path under the mirror, or None: outside the prefix, a directory marker's own name, or a path
    that would leave the mirror."""
    rel = key[len(prefix) + 1:] if prefix else key
    if prefix and not key.startswith(prefix + "/") or not rel:
        return None
    if rel.startswith("/") or "\\" in rel or any(p in ("", ".", "..") for p in rel.rstrip("/").split("/")):
        log.warning("model repository: object '%s' is skipped: its key leaves the repository", key)
        return None
    return rel


class RemoteMirror:
    """A local directory (`root`) kept in step with a remote repository; `sync` is blocking (run it off the loop).
    `store`: what lists and downloads the objects (made from the location's scheme at the first sync)."""

    def __init__(self, location: RemoteLocation, root: Path, store=None) -> None:
        self.location = location
        self.root = root
        self._store = store
        self._have: dict[str, tuple[int, str]] = {}  # relative path -> (size, ETag) of the object downloaded

    def sync(self) -> tuple[int, int]:
        """Bring the mirror in line with the bucket; returns (files downloaded, files removed)."""
        if self._store is None:
            self._store = (_S3Store if self.location.scheme == "s3" else _GcsStore)(self.location)
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
        prefix = self.location.prefix
        listed: dict[str, tuple[int, str, bool]] = {}
        for key, size, etag in self._store.objects(prefix + "/" if prefix else ""):
            rel = _relative(key, prefix)
            if rel is not None:
                is_dir = rel.endswith("/")  # an empty directory's marker (an ensemble's `NAME/1/`)
                listed[rel.rstrip("/")] = (size, etag, is_dir)
        return listed

    def _fetch(self, rel: str) -> None:
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(_PART + target.name)
        self._store.download(f"{self.location.prefix}/{rel}".lstrip("/"), str(part))
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
    """The object-store repositories among a server's, each mirrored in a temporary directory of its own; `refresh`
    syncs them all, one sync at a time (start-up, each poll, each load request), off the event loop."""

    def __init__(self, locations: Sequence[str]) -> None:
        try:
            parsed = [parse_remote_url(loc) for loc in locations if is_remote(loc)]
        except ValueError as exc:
            raise SystemExit(f"gt-serve: {exc}") from None
        for location in parsed:
            _check_library(location)
        self._mirrors = {loc.url: RemoteMirror(loc, Path(tempfile.mkdtemp(prefix="gt_serve_repo_"))) for loc in parsed}
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
                except Exception as exc:  # noqa: BLE001 - the stores' and the disk's errors alike
                    raise Unavailable(f"model repository '{url}' cannot be read: {type(exc).__name__}: {exc}") \
                        from None

    def close(self) -> None:
        for mirror in self._mirrors.values():
            mirror.close()
