"""Helpers for tests and benchmarks that start real parts (a mosquitto broker, ...); never imported by the server."""
