"""Pure logic: asyncio primitives allowed; no sockets, no onnxruntime, no cupy."""
