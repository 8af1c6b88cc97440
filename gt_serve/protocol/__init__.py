"""The edge of the server: the only code that knows HTTP, gRPC, JSON and protobuf wire formats."""
