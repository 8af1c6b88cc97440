"""edge/s3_repository.py: Triton's forms of an s3:// repository path, and S3Mirror keeping a local directory in step
with a bucket's prefix, against moto's S3 server on loopback (the S3 REST API over a real socket)."""
from __future__ import annotations

import asyncio

import pytest

from gt_serve.edge.s3_repository import RepositoryMirrors, S3Location, S3Mirror, parse_s3_url
from gt_serve.errors import Unavailable
from gt_serve.testing.s3_server import s3_server


@pytest.mark.parametrize("url,want", [
    ("s3://bucket/path/to/repo", S3Location("s3://bucket/path/to/repo", None, "bucket", "path/to/repo")),
    ("s3://bucket", S3Location("s3://bucket", None, "bucket", "")),
    ("s3://bucket/repo/", S3Location("s3://bucket/repo/", None, "bucket", "repo")),
    ("s3://minio.local:9000/models/repo", S3Location("s3://minio.local:9000/models/repo", "http://minio.local:9000",
                                                     "models", "repo")),
    ("s3://https://minio.svc:443/models/", S3Location("s3://https://minio.svc:443/models/", "https://minio.svc:443",
                                                      "models", "")),
])
def test_triton_forms_of_an_s3_path(url, want):
    assert parse_s3_url(url) == want


@pytest.mark.parametrize("url", ["s3://", "s3:///repo", "s3://https://no-port/models", "/local/dir"])
def test_a_bad_s3_path_is_refused_naming_it(url):
    with pytest.raises(ValueError, match="s3://"):
        parse_s3_url(url)


@pytest.fixture(scope="module")
def s3():
    with s3_server() as server:
        server.client.create_bucket(Bucket="models")
        yield server


def _put(s3, key: str, body: bytes) -> None:
    s3.client.put_object(Bucket="models", Key=key, Body=body)


def test_sync_downloads_new_and_changed_objects_and_removes_gone_ones(s3, tmp_path):
    _put(s3, "unit/m/config.pbtxt", b"name: 'm'")
    _put(s3, "unit/m/1/model.onnx", b"weights-1")
    _put(s3, "unit/ens/1/", b"")  # an empty directory's marker (an ensemble's version)
    _put(s3, "unit/../outside.txt", b"escape")  # a key that would leave the mirror
    _put(s3, "other/n/1/model.onnx", b"not ours")  # another prefix
    root = tmp_path / "mirror"
    root.mkdir()
    mirror = S3Mirror(parse_s3_url(s3.url("models", "unit")), root)
    assert mirror.sync() == (2, 0)
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
    assert files == ["ens", "ens/1", "m", "m/1", "m/1/model.onnx", "m/config.pbtxt"]
    assert (root / "m" / "1" / "model.onnx").read_bytes() == b"weights-1"
    assert not (tmp_path / "outside.txt").exists()
    assert mirror.sync() == (0, 0)  # nothing changed: nothing fetched
    before = (root / "m" / "1" / "model.onnx").stat().st_mtime_ns
    _put(s3, "unit/m/1/model.onnx", b"weights-2")  # same size, other content
    assert mirror.sync() == (1, 0)
    assert (root / "m" / "1" / "model.onnx").read_bytes() == b"weights-2"
    assert (root / "m" / "1" / "model.onnx").stat().st_mtime_ns != before  # what the poller's fingerprint sees
    s3.client.delete_object(Bucket="models", Key="unit/m/1/model.onnx")
    s3.client.delete_object(Bucket="models", Key="unit/m/config.pbtxt")
    assert mirror.sync() == (0, 2)
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == ["ens", "ens/1"]  # emptied dirs gone


def test_an_unreachable_repository_is_unavailable_naming_it(s3, tmp_path):
    url = "s3://127.0.0.1:1/models/repo"  # nothing listens on port 1
    mirrors = RepositoryMirrors([url, str(tmp_path)])
    try:
        assert mirrors.local_paths([url, str(tmp_path)])[1] == tmp_path
        with pytest.raises(Unavailable, match=r"model repository 's3://127.0.0.1:1/models/repo' cannot be read"):
            asyncio.run(mirrors.refresh())
    finally:
        mirrors.close()
