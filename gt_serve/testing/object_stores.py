"""Object stores on loopback for the tests, each in a thread of the test process and speaking its real REST API over
a real socket: moto's S3 server (`s3_server`) and gcp-storage-emulator's Cloud Storage (`gcs_server`), each with a
client of it and the same helpers: a repository's URL, uploading a tree, putting and deleting objects."""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .mosquitto import free_port

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "gt-serve-test", "AWS_SECRET_ACCESS_KEY": "gt-serve-test",
               "AWS_DEFAULT_REGION": "us-east-1", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1",
               "AWS_MAX_ATTEMPTS": "1", "AWS_RETRY_MODE": "standard"}


class _Store:
    scheme = ""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint  # http://127.0.0.1:PORT

    def url(self, bucket: str, prefix: str) -> str:
        raise NotImplementedError

    def put(self, bucket: str, key: str, body: bytes) -> None:
        raise NotImplementedError

    def keys(self, bucket: str, prefix: str) -> list[str]:
        raise NotImplementedError

    def delete(self, bucket: str, key: str) -> None:
        raise NotImplementedError

    def upload_tree(self, root: Path, bucket: str, prefix: str) -> list[str]:
        """Every file under `root` as an object under `prefix`; returns the keys."""
        keys = []
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            keys.append(f"{prefix}/{path.relative_to(root).as_posix()}")
            self.put(bucket, keys[-1], path.read_bytes())
        return keys

    def delete_prefix(self, bucket: str, prefix: str) -> None:
        for key in self.keys(bucket, prefix):
            self.delete(bucket, key)


class S3Server(_Store):
    scheme = "s3"

    def __init__(self, endpoint: str) -> None:
        import boto3

        super().__init__(endpoint)
        self.client = boto3.session.Session().client("s3", endpoint_url=endpoint)

    def url(self, bucket: str, prefix: str) -> str:
        """In Triton's host:port form."""
        return f"s3://{self.endpoint.removeprefix('http://')}/{bucket}/{prefix}"

    def create_bucket(self, bucket: str) -> None:
        self.client.create_bucket(Bucket=bucket)

    def put(self, bucket: str, key: str, body: bytes) -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=body)

    def keys(self, bucket: str, prefix: str) -> list[str]:
        return [o["Key"] for o in self.client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]

    def delete(self, bucket: str, key: str) -> None:
        self.client.delete_object(Bucket=bucket, Key=key)


class GcsServer(_Store):
    """Reached through STORAGE_EMULATOR_HOST (set for this process and inherited by the servers it starts):
    google-cloud-storage then sends anonymous requests to the emulator."""

    scheme = "gs"

    def __init__(self, endpoint: str) -> None:
        from google.cloud import storage

        super().__init__(endpoint)
        self.client = storage.Client()

    def url(self, bucket: str, prefix: str) -> str:
        return f"gs://{bucket}/{prefix}"

    def create_bucket(self, bucket: str) -> None:
        self.client.create_bucket(bucket)

    def put(self, bucket: str, key: str, body: bytes) -> None:
        self.client.bucket(bucket).blob(key).upload_from_string(body)

    def keys(self, bucket: str, prefix: str) -> list[str]:
        return [b.name for b in self.client.list_blobs(bucket, prefix=prefix)]

    def delete(self, bucket: str, key: str) -> None:
        self.client.bucket(bucket).blob(key).delete()


@contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """`values` in os.environ (the servers the tests start inherit them) while the store runs; put back after."""
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def s3_server() -> Iterator[S3Server]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:  # credentials the environment already holds are kept
        with _environ({k: v for k, v in CREDENTIALS.items() if k not in os.environ}):
            host, port = server.get_host_and_port()
            yield S3Server(f"http://{host}:{port}")
    finally:
        server.stop()


@contextmanager
def gcs_server() -> Iterator[GcsServer]:
    from gcp_storage_emulator.server import create_server

    port = free_port()  # the emulator takes no port 0
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    try:
        with _environ({"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"}):
            yield GcsServer(os.environ["STORAGE_EMULATOR_HOST"])
    finally:
        server.stop()
