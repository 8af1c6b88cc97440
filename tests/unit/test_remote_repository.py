"""edge/remote_repository.py: Triton's forms of an s3:// and gs:// repository path, and RemoteMirror keeping a local
directory in step with a bucket's prefix, against moto's S3 server and gcp-storage-emulator's Cloud Storage on
loopback (each store's REST API over a real socket)."""
from __future__ import annotations

import asyncio

import pytest

from gt_serve.edge.remote_repository import (RemoteLocation, RemoteMirror, RepositoryMirrors, _relative,
                                             parse_remote_url)
from gt_serve.errors import Unavailable
from gt_serve.testing.object_stores import CREDENTIALS, gcs_server, s3_server


@pytest.mark.parametrize("url,want", [
    ("s3://bucket/path/to/repo", RemoteLocation("s3://bucket/path/to/repo", "s3", None, "bucket", "path/to/repo")),
    ("s3://bucket", RemoteLocation("s3://bucket", "s3", None, "bucket", "")),
    ("s3://bucket/repo/", RemoteLocation("s3://bucket/repo/", "s3", None, "bucket", "repo")),
    ("s3://minio.local:9000/models/repo", RemoteLocation("s3://minio.local:9000/models/repo", "s3",
                                                         "http://minio.local:9000", "models", "repo")),
    ("s3://https://minio.svc:443/models/", RemoteLocation("s3://https://minio.svc:443/models/", "s3",
                                                          "https://minio.svc:443", "models", "")),
    ("gs://bucket/path/to/repo", RemoteLocation("gs://bucket/path/to/repo", "gs", None, "bucket", "path/to/repo")),
])
def test_triton_forms_of_an_object_store_path(url, want):
    assert parse_remote_url(url) == want


@pytest.mark.parametrize("url", ["s3://", "s3:///repo", "s3://https://no-port/models", "gs://", "/local/dir"])
def test_a_bad_object_store_path_is_refused_naming_it(url):
    with pytest.raises(ValueError, match=r"(s3|gs)://"):
        parse_remote_url(url)


@pytest.mark.parametrize("key,want", [("repo/m/1/x", "m/1/x"), ("repo/m/1/", "m/1/"), ("repo/", None),
                                      ("other/m/1/x", None), ("repository/m", None), ("repo/../x", None),
                                      ("repo/m/../../x", None), ("repo//etc/x", None), ("repo/./m", None),
                                      ("repo/m//x", None)])
def test_a_key_maps_into_the_mirror_or_is_skipped(key, want):
    assert _relative(key, "repo") == want


@pytest.fixture(scope="module", params=["s3", "gcs"])
def store(request):
    with (s3_server if request.param == "s3" else gcs_server)() as server:
        server.create_bucket("models")
        yield server


def _put(store, key: str, body: bytes) -> None:
    store.put("models", key, body)


def test_sync_downloads_new_and_changed_objects_and_removes_gone_ones(store, tmp_path):
    _put(store, "unit/m/config.pbtxt", b"name: 'm'")
    _put(store, "unit/m/1/model.onnx", b"weights-1")
    _put(store, "unit/ens/1/", b"")  # an empty directory's marker (an ensemble's version)
    if store.scheme == "s3":  # a key that would leave the mirror (both stores take one; the GCS emulator does not)
        _put(store, "unit/../outside.txt", b"escape")
    _put(store, "other/n/1/model.onnx", b"not ours")  # another prefix
    root = tmp_path / "mirror"
    root.mkdir()
    mirror = RemoteMirror(parse_remote_url(store.url("models", "unit")), root)
    assert mirror.sync() == (2, 0)
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
    assert files == ["ens", "ens/1", "m", "m/1", "m/1/model.onnx", "m/config.pbtxt"]
    assert (root / "m" / "1" / "model.onnx").read_bytes() == b"weights-1"
    assert not (tmp_path / "outside.txt").exists()
    assert mirror.sync() == (0, 0)  # nothing changed: nothing fetched
    before = (root / "m" / "1" / "model.onnx").stat().st_mtime_ns
    _put(store, "unit/m/1/model.onnx", b"weights-2")  # same size, other content
    assert mirror.sync() == (1, 0)
    assert (root / "m" / "1" / "model.onnx").read_bytes() == b"weights-2"
    assert (root / "m" / "1" / "model.onnx").stat().st_mtime_ns != before  # what the poller's fingerprint sees
    store.delete("models", "unit/m/1/model.onnx")
    store.delete("models", "unit/m/config.pbtxt")
    assert mirror.sync() == (0, 2)
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == ["ens", "ens/1"]  # emptied dirs gone


def test_an_unreachable_repository_is_unavailable_naming_it(tmp_path, monkeypatch):
    for key, value in CREDENTIALS.items():  # boto3 looks no further for credentials (no instance metadata)
        monkeypatch.setenv(key, value)
    url = "s3://127.0.0.1:1/models/repo"  # nothing listens on port 1
    mirrors = RepositoryMirrors([url, str(tmp_path)])
    try:
        assert mirrors.local_paths([url, str(tmp_path)])[1] == tmp_path
        with pytest.raises(Unavailable, match=r"model repository 's3://127.0.0.1:1/models/repo' cannot be read"):
            asyncio.run(mirrors.refresh())
    finally:
        mirrors.close()


@pytest.mark.parametrize("module", ["no_such_module_gt", "no_such_package_gt.storage"])
def test_a_missing_store_library_stops_the_start_naming_the_extra(monkeypatch, module):
    from gt_serve.edge import remote_repository

    monkeypatch.setitem(remote_repository._LIBRARIES, "gs", (module, "gcs"))
    with pytest.raises(SystemExit, match=r"model repository 'gs://models/repo' needs no_such_.*'gt-serve\[gcs\]'"):
        RepositoryMirrors(["gs://models/repo"])
