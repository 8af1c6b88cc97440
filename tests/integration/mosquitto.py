"""Moved to gt_serve/testing/mosquitto.py (bench/ must not import tests/): edit it there. This re-export
only keeps an import of the old path working until every importer has moved."""
from gt_serve.testing.mosquitto import (  # noqa: F401
    Mosquitto,
    TestPki,
    free_port,
    make_test_pki,
    mosquitto_binary,
)
