"""`model_operations` (custom-operator libraries): registered with every session of the model as Triton's
onnxruntime backend registers them, read by the load's describe step too, refused with the library's name when it
cannot be loaded, and named by a load request's config only where the operator allowed it (server.op_libraries).
The library is onnxruntime-extensions' (a test dependency); the model uses its StringLower operator."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime_extensions
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from gt_serve.backends.onnx_runner import OnnxRunner, describe_model
from gt_serve.core.model_config import parse_pbtxt
from gt_serve.core.repository_paths import check_config_paths, check_request_libraries
from gt_serve.core.session_settings import session_settings
from gt_serve.errors import InvalidArgument, PathNotAllowed
from gt_serve.testing import feature_models as fm

LIBRARY = onnxruntime_extensions.get_library_path()
WORDS = np.array([["HeLLo", "WORLD"], ["Ünïcode", "ok"]], dtype=object)


@pytest.fixture(scope="module")
def lower(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("lower") / "model.onnx"
    fm.string_lower(path)
    return str(path)


def _config(*libraries: str) -> mc.ModelConfig:
    named = "".join(f' op_library_filename: "{lib}"' for lib in libraries)
    return parse_pbtxt(f'name: "lower"\nmax_batch_size: 8\nmodel_operations {{{named} }}\n', "test")


def test_the_library_is_registered_with_the_session(lower):
    settings = session_settings(_config(LIBRARY))
    assert settings is not None and settings.op_libraries == (LIBRARY,)
    runner = OnnxRunner(lower, intra_op_threads=1, settings=settings)
    try:
        out = runner.session.run(None, {"INPUT": WORDS})[0]
    finally:
        runner.close()
    assert out.tolist() == [["hello", "world"], ["ünïcode", "ok"]]


def test_without_the_library_the_graph_cannot_be_read(lower):
    """The control: the operator is not onnxruntime's own, so the load's describe step needs the library too."""
    with pytest.raises(Exception, match="StringLower"):
        describe_model(lower)
    inputs, outputs = describe_model(lower, (LIBRARY,))
    assert [(t.name, t.datatype) for t in inputs + outputs] == [("INPUT", "BYTES"), ("OUTPUT", "BYTES")]


def test_a_library_that_cannot_be_loaded_is_named(lower, tmp_path):
    not_a_library = tmp_path / "libnot.so"
    not_a_library.write_bytes(b"not an ELF file")
    for library in (str(tmp_path / "missing.so"), str(not_a_library)):
        with pytest.raises(InvalidArgument, match=f"model_operations op_library_filename '{library}' could not be"):
            OnnxRunner(lower, settings=session_settings(_config(library)))


@pytest.mark.parametrize("library", ["", "lib\nx.so", "lib\x00x.so"])
def test_a_library_name_with_control_characters_is_refused_before_anything_loads(library):
    cfg = mc.ModelConfig(name="lower")
    cfg.model_operations.op_library_filename.append(library)
    with pytest.raises(PathNotAllowed, match="model_operations op_library_filename"):
        check_config_paths(cfg, "lower")


def test_a_load_requests_config_names_only_allowed_libraries():
    check_request_libraries(_config(), "lower", frozenset())  # naming none needs no allowance
    check_request_libraries(_config(LIBRARY), "lower", frozenset({LIBRARY}))
    with pytest.raises(PathNotAllowed, match="not one the server allows a load request to name"):
        check_request_libraries(_config(LIBRARY), "lower", frozenset())
    with pytest.raises(PathNotAllowed, match="/tmp/evil.so"):  # every library is checked, not only the first
        check_request_libraries(_config(LIBRARY, "/tmp/evil.so"), "lower", frozenset({LIBRARY}))


def test_a_model_without_model_operations_registers_nothing():
    assert session_settings(parse_pbtxt('name: "m"\nmax_batch_size: 8\n', "test")) is None
    assert Path(LIBRARY).is_file()  # what the other tests rely on
