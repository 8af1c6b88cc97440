"""Wire-format helpers shared by the HTTP and gRPC front ends.

The datatype tables and the raw tensor encoding live in gt_serve.datatypes (the data plane needs
them too, for shared memory); they are re-exported here for the front ends.
"""
from __future__ import annotations

__all__ = ["DATATYPES", "array_from_list", "array_from_raw", "check_shape", "deserialize_bytes", "element_count",
           "list_from_array", "numpy_dtype", "raw_from_array", "serialize_bytes", "v2_datatype"]

from ..datatypes import (  # noqa: E402  (re-exported)
    DATATYPES,
    array_from_list,
    array_from_raw,
    check_shape,
    deserialize_bytes,
    element_count,
    list_from_array,
    numpy_dtype,
    raw_from_array,
    serialize_bytes,
    v2_datatype,
)
