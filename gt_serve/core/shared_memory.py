"""System shared memory regions (POSIX shm under /dev/shm), registered by name.

Regions are re-validated and re-opened on each use (a client may recreate them); reads and writes
use pread/pwrite on a file descriptor, so nothing stays mapped between requests.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import AlreadyExists, InvalidArgument

SHM_ROOT = "/dev/shm"


@dataclass(frozen=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int

    def as_dict(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


def _path_for_key(key: str) -> str:
    rel = key[1:] if key.startswith("/") else key
    if not rel or "/" in rel or rel in (".", ".."):
        raise InvalidArgument(f"invalid shared memory key '{key}'")
    return os.path.join(SHM_ROOT, rel)


class SystemSharedMemory:
    def __init__(self) -> None:
        self._regions: dict[str, Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise InvalidArgument("shared memory region name must not be empty")
        if name in self._regions:
            raise AlreadyExists(f"shared memory region '{name}' is already registered")
        if offset < 0 or byte_size <= 0:
            raise InvalidArgument(f"shared memory region '{name}': invalid offset {offset} or byte_size {byte_size}")
        path = _path_for_key(key)
        try:
            size = os.stat(path).st_size
        except OSError:
            raise InvalidArgument(f"unable to open shared memory region '{name}': key '{key}' does not exist") from None
        if offset + byte_size > size:
            raise InvalidArgument(f"shared memory region '{name}': offset {offset} + byte_size {byte_size} "
                                  f"exceeds the {size}-byte object '{key}'")
        self._regions[name] = Region(name, key, offset, byte_size)

    def unregister(self, name: str = "") -> None:
        if not name:
            self._regions.clear()
            return
        self._regions.pop(name, None)

    def status(self, name: str = "") -> list[dict]:
        if name:
            region = self._regions.get(name)
            if region is None:
                raise InvalidArgument(f"unable to find system shared memory region: '{name}'")
            return [region.as_dict()]
        return [r.as_dict() for r in self._regions.values()]

    def _locate(self, name: str, offset: int, nbytes: int, tensor: str) -> tuple[str, int]:
        region = self._regions.get(name)
        if region is None:
            raise InvalidArgument(f"tensor '{tensor}': shared memory region '{name}' is not registered")
        if offset < 0 or nbytes < 0 or offset + nbytes > region.byte_size:
            raise InvalidArgument(f"tensor '{tensor}': offset {offset} + size {nbytes} is outside shared memory "
                                  f"region '{name}' ({region.byte_size} bytes)")
        return _path_for_key(region.key), region.offset + offset

    def read(self, name: str, offset: int, nbytes: int, tensor: str) -> bytes:
        path, start = self._locate(name, offset, nbytes, tensor)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            raise InvalidArgument(f"tensor '{tensor}': shared memory region '{name}' no longer exists") from None
        try:
            data = os.pread(fd, nbytes, start)
        finally:
            os.close(fd)
        if len(data) != nbytes:
            raise InvalidArgument(f"tensor '{tensor}': shared memory region '{name}' is shorter than registered")
        return data

    def write(self, name: str, offset: int, data, capacity: int, tensor: str) -> None:
        nbytes = len(data)
        if nbytes > capacity:
            raise InvalidArgument(f"output '{tensor}': {nbytes} bytes do not fit the {capacity} bytes given for "
                                  f"shared memory region '{name}'")
        path, start = self._locate(name, offset, capacity, tensor)
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            raise InvalidArgument(f"output '{tensor}': shared memory region '{name}' no longer exists") from None
        try:
            os.pwrite(fd, data, start)
        finally:
            os.close(fd)


class CudaSharedMemory:
    """CUDA IPC regions need a GPU-side mapper; without one, status is empty and register is refused."""

    def __init__(self, gpu_available: bool = False) -> None:
        self.gpu_available = gpu_available

    def register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        raise InvalidArgument(f"cannot register CUDA shared memory region '{name}': CUDA shared memory is not "
                          "supported by this server" + ("" if self.gpu_available else " (no GPU present)"))

    def unregister(self, name: str = "") -> None:
        return None

    def status(self, name: str = "") -> list[dict]:
        if name:
            raise InvalidArgument(f"unable to find CUDA shared memory region: '{name}'")
        return []
