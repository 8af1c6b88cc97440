"""A server-side HTTP/2 transport (RFC 9113, prior knowledge) hardened for a public port; no gRPC
or grpcio types here: `protocol/grpc_native.py` builds gRPC on top of `connection.H2Connection`."""
from .connection import H2Connection, H2Stream
from .frames import PREFACE, H2ConnectionError, H2StreamError
from .limits import H2Limits

__all__ = ["H2Connection", "H2Stream", "H2ConnectionError", "H2StreamError", "H2Limits", "PREFACE"]
