"""System shared memory regions (POSIX shm under /dev/shm), registered by name.

Reads and writes use pread/pwrite on a file descriptor, so nothing is ever mapped and a region that
is truncated later cannot raise SIGBUS here: it is refused by the size check before the copy. The
object behind a key is re-validated on each use (a client may recreate it, or swap it for a
symlink): the descriptor opened for it is kept (at most MAX_KEPT keys, least recently used first
out) and used only while `lstat` of the key still names the same object (device and inode), whose
size and owner that `lstat` also gives; anything else is opened afresh through every check below.
Two system calls per tensor instead of six (issue #17: perf_analyzer `--shared-memory system`).

The rules (what Triton's shm_open-based registration implies, made explicit):
- a key is `/name` or `name`: one path component directly in /dev/shm, no further '/', no NUL,
  not '.' or '..', at most NAME_MAX (255) bytes of UTF-8;
- the object is opened with O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY (a planted symlink is
  refused, a planted FIFO cannot block the server) and fstat-ed: it must be a regular file on the
  shm filesystem, owned by the server's effective uid (Triton clients create regions as the same
  user; another owner is refused);
- offset and byte_size are integers in [0, 2**63) (byte_size at least 1 at registration), and
  offset + byte_size must fit the object's size, at registration and again at every read/write.
"""
from __future__ import annotations

import errno
import os
import stat
from collections import OrderedDict
from dataclasses import dataclass, field

from ..errors import AlreadyExists, InvalidArgument

SHM_ROOT = "/dev/shm"
MAX_KEY_BYTES = 255  # NAME_MAX: what shm_open accepts for the name after the leading '/'
MAX_NAME_CHARS = 1024  # region names are only dictionary keys; bounded so a request cannot store megabytes
MAX_EXTENT = 2**63 - 1  # off_t
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
MAX_KEPT = 64  # descriptors kept open for recently used keys (a client may register many more regions)


@dataclass(frozen=True)
class _Kept:
    """A descriptor open on the object a key named when it was opened, and that object's identity."""
    fd: int
    dev: int
    ino: int
    writable: bool


@dataclass(frozen=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    path: str = field(default="", compare=False, repr=False)  # the object's path under the shm root, checked once

    def as_dict(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


def check_key(key: object, what: str = "shared memory region") -> str:
    """The file name in the shm directory for `key`, or InvalidArgument naming 'key'."""
    if not isinstance(key, str) or not key:
        raise InvalidArgument(f"{what}: 'key' must be a non-empty string, got {key!r}")
    rel = key[1:] if key.startswith("/") else key
    shown = repr(key[:64]) + ("..." if len(key) > 64 else "")
    if "\x00" in key:
        raise InvalidArgument(f"{what}: 'key' {shown} contains a NUL character")
    if not rel or "/" in rel or rel in (".", ".."):
        raise InvalidArgument(f"{what}: 'key' {shown} must be '/name' or 'name' with no further '/'")
    try:
        size_bytes = len(rel.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what}: 'key' {shown} is not valid UTF-8") from None
    if size_bytes > MAX_KEY_BYTES:
        raise InvalidArgument(f"{what}: 'key' is {size_bytes} bytes long; the limit is {MAX_KEY_BYTES}")
    return rel


def check_extent(field: str, value: object, what: str, minimum: int = 0) -> int:
    """An offset or byte size: an int in [minimum, 2**63), or InvalidArgument naming `field`."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_EXTENT:
        shown = repr(value) if not isinstance(value, str) else repr(value[:64])
        bound = "a positive" if minimum > 0 else "a non-negative"
        raise InvalidArgument(f"{what}: '{field}' must be {bound} integer below 2**63, got {shown}")
    return value


def check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidArgument("shared memory region name must not be empty")
    if len(name) > MAX_NAME_CHARS:
        raise InvalidArgument(f"shared memory region name is {len(name)} characters long; "
                              f"the limit is {MAX_NAME_CHARS}")
    return name


class SystemSharedMemory:
    def __init__(self, root: str = SHM_ROOT) -> None:
        self._root = root
        self._regions: dict[str, Region] = {}
        self._kept: OrderedDict[str, _Kept] = OrderedDict()  # by path; used on the event loop only
        self._euid = os.geteuid()

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        name = check_name(name)
        what = f"shared memory region '{name}'"
        offset = check_extent("offset", offset, what)
        byte_size = check_extent("byte_size", byte_size, what, minimum=1)
        if name in self._regions:
            raise AlreadyExists(f"{what} is already registered")
        path = os.path.join(self._root, check_key(key, what))
        _, size = self._object(path, key, what, writable=False)
        try:
            self._check_fits(size, offset + byte_size, what, key)
        except InvalidArgument:
            if all(r.path != path for r in self._regions.values()):
                self._forget(path)  # nothing registered keeps the object open
            raise
        self._regions[name] = Region(name, key, offset, byte_size, path)

    def unregister(self, name: str = "") -> None:
        if not name:
            self._regions.clear()
        else:
            self._regions.pop(name, None)
        in_use = {r.path for r in self._regions.values()}
        for path in [path for path in self._kept if path not in in_use]:
            self._forget(path)  # a client unlinking the object after this gets its memory back

    def close(self) -> None:
        """Unregister everything and close the kept descriptors (the server is stopping)."""
        self.unregister()

    def status(self, name: str = "") -> list[dict]:
        if name:
            region = self._regions.get(name)
            if region is None:
                raise InvalidArgument(f"Unable to find system shared memory region: '{name}'")  # Triton's words
            return [region.as_dict()]
        return [r.as_dict() for r in self._regions.values()]

    def read(self, name: str, offset: object, nbytes: object, tensor: str) -> bytes:
        what = f"input '{tensor}'"
        region, start, nbytes = self._locate(name, offset, nbytes, what)
        where = f"{what}: shared memory region '{name}'"
        fd, size = self._object(region.path, region.key, where, writable=False)
        self._check_fits(size, start + nbytes, where, region.key)
        data = os.pread(fd, nbytes, start)
        if len(data) != nbytes:  # truncated between the size check and the read
            raise InvalidArgument(f"{what}: shared memory region '{name}' is shorter than registered")
        return data

    def write(self, name: str, offset: object, data, capacity: object, tensor: str) -> None:
        what = f"output '{tensor}'"
        region, start, capacity = self._locate(name, offset, capacity, what)
        nbytes = len(data) if not isinstance(data, memoryview) else data.nbytes
        if nbytes > capacity:
            raise InvalidArgument(f"{what}: {nbytes} bytes do not fit the {capacity} bytes given for "
                                  f"shared memory region '{name}'")
        where = f"{what}: shared memory region '{name}'"
        fd, size = self._object(region.path, region.key, where, writable=True)
        self._check_fits(size, start + capacity, where, region.key)  # a truncated object is not grown again
        os.pwrite(fd, data, start)

    def check(self, name: object, offset: object, nbytes: object, what: str) -> None:
        """Validate a tensor's region, offset and size before the model runs (no file access)."""
        self._locate(name, offset, nbytes, what)

    # -- helpers ------------------------------------------------------------------------------
    def _locate(self, name: object, offset: object, nbytes: object, what: str) -> tuple[Region, int, int]:
        region = self._regions.get(name) if isinstance(name, str) else None
        if region is None:
            raise InvalidArgument(f"Unable to find shared memory region: '{name}' ({what}: the region is not registered)")
        if type(offset) is not int or not 0 <= offset <= MAX_EXTENT:  # the usual case without a call
            offset = check_extent("shared_memory_offset", offset, what)
        if type(nbytes) is not int or not 0 <= nbytes <= MAX_EXTENT:
            nbytes = check_extent("shared_memory_byte_size", nbytes, what)
        if offset + nbytes > region.byte_size:
            raise InvalidArgument(f"{what}: shared_memory_offset {offset} + shared_memory_byte_size {nbytes} is "
                                  f"outside shared memory region '{name}' ({region.byte_size} bytes)")
        return region, region.offset + offset, nbytes

    def _object(self, path: str, key: str, what: str, writable: bool) -> tuple[int, int]:
        """(a descriptor on the object `key` names now, its size). The kept descriptor serves while `lstat` of
        the key finds the object it was opened on (a symlink or a recreated object is another inode, so it
        goes through `_open`'s checks afresh); the owner is checked on every use, as a chown may come later."""
        kept = self._kept.get(path)
        if kept is not None and (kept.writable or not writable):
            try:
                st = os.lstat(path)
            except OSError:
                st = None
            if st is not None and st.st_ino == kept.ino and st.st_dev == kept.dev:
                self._check_owner(st, key, what)
                self._kept.move_to_end(path)
                return kept.fd, st.st_size
        self._forget(path)
        fd, st = self._open(path, key, what, writable)
        self._kept[path] = _Kept(fd, st.st_dev, st.st_ino, writable)
        while len(self._kept) > MAX_KEPT:
            self._forget(next(iter(self._kept)))
        return fd, st.st_size

    def _forget(self, path: str) -> None:
        kept = self._kept.pop(path, None)
        if kept is not None:
            os.close(kept.fd)

    def _open(self, path: str, key: str, what: str, writable: bool) -> tuple[int, os.stat_result]:
        """Open the object at `path` (the checked `key`'s, under the shm root) without following links and check it
        is ours to use: (the descriptor, its fstat)."""
        try:
            fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | _OPEN_FLAGS)
        except OSError as exc:
            raise InvalidArgument(f"{what}: unable to open shared memory key '{key}': "
                                  f"{_open_reason(exc)}") from None
        try:
            st = os.fstat(fd)
            self._check_object(st, key, what)
        except BaseException:
            os.close(fd)
            raise
        return fd, st

    def _check_object(self, st: os.stat_result, key: str, what: str) -> None:
        if not stat.S_ISREG(st.st_mode):
            raise InvalidArgument(f"{what}: shared memory key '{key}' is not a regular shared memory object")
        if st.st_dev != os.stat(self._root).st_dev:
            raise InvalidArgument(f"{what}: shared memory key '{key}' is not on the shared memory filesystem")
        self._check_owner(st, key, what)

    def _check_owner(self, st: os.stat_result, key: str, what: str) -> None:
        if st.st_uid != self._euid:
            raise InvalidArgument(f"{what}: shared memory key '{key}' is owned by uid {st.st_uid}, not by the "
                                  f"server's uid {self._euid}")

    @staticmethod
    def _check_fits(size: int, end: int, what: str, key: str) -> None:
        if end > size:
            raise InvalidArgument(f"{what}: offset + byte_size ({end} bytes) exceeds the {size}-byte "
                                  f"shared memory object '{key}'")


def _open_reason(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "it is a symbolic link (refused)"
    if exc.errno == errno.ENOENT:
        return "it does not exist"
    if exc.errno == errno.ENXIO:
        return "it is not a regular shared memory object"
    return exc.strerror or type(exc).__name__


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
