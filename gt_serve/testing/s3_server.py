"""An S3-compatible server on loopback for the tests (moto's, in a thread of the test process: the S3 REST API over a
real socket), with a boto3 client of it and helpers to upload a model repository."""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "gt-serve-test", "AWS_SECRET_ACCESS_KEY": "gt-serve-test",
               "AWS_DEFAULT_REGION": "us-east-1", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1",
               "AWS_MAX_ATTEMPTS": "1", "AWS_RETRY_MODE": "standard"}


@dataclass
class S3Server:
    endpoint: str  # http://127.0.0.1:PORT
    client: object  # boto3's S3 client of it

    def url(self, bucket: str, prefix: str) -> str:
        """The repository's URL in Triton's host:port form."""
        return f"s3://{self.endpoint.removeprefix('http://')}/{bucket}/{prefix}"

    def upload_tree(self, root: Path, bucket: str, prefix: str) -> list[str]:
        """Every file under `root` as an object under `prefix`; returns the keys."""
        keys = []
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            key = f"{prefix}/{path.relative_to(root).as_posix()}"
            self.client.upload_file(str(path), bucket, key)
            keys.append(key)
        return keys

    def delete_prefix(self, bucket: str, prefix: str) -> None:
        listed = self.client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
        for obj in listed:
            self.client.delete_object(Bucket=bucket, Key=obj["Key"])


@contextmanager
def s3_server() -> Iterator[S3Server]:
    import boto3
    from moto.server import ThreadedMotoServer

    os.environ.update({k: v for k, v in CREDENTIALS.items() if k not in os.environ})
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        yield S3Server(endpoint, boto3.session.Session().client("s3", endpoint_url=endpoint))
    finally:
        server.stop()
