"""Threads and streams: lanes that run batches off the event loop."""
