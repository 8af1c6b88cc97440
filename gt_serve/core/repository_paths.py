"""Where a model's files may be: plain model names, files a config names confined to the model
directory, and uploaded model files under one per-process directory.

The rules (SECURITY.md lists them too):
- a model name is a plain name: not empty, at most 255 bytes, no '/', '\\', NUL or control character,
  not starting with '.';
- a file a config names (output label_filename, default_model_filename, cc_model_filenames, warm-up
  input_data_file, a state's initial data_file) and the path of a 'file:' upload is relative: not empty, no
  absolute path, no '..' component, no '\\', NUL or control character;
- it must also resolve, symlinks followed, inside the real path of the model directory;
- a custom-operator library (model_operations) is a server-side path, given to onnxruntime as written (no
  control character); a load request's config may name only the libraries listed in server.op_libraries.
A rejected path gets one message whatever lies at the target: the checks never look outside the model
directory, so an answer cannot tell what exists there.
"""
from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from tritonclient.grpc import model_config_pb2 as mc

from ..errors import ConfigError, PathNotAllowed

log = logging.getLogger(__name__)

NAME_RULE = "a plain name: no '/', '\\', '..', NUL or control characters, no leading '.'"
UPLOAD_PREFIX = "gt_serve_uploads_"
MAX_NAME_BYTES = 255
_SHOWN_CHARS = 200


def shown(value: str) -> str:
    """A client-supplied string as it goes back into an error message: bounded, control characters escaped."""
    text = value if len(value) <= _SHOWN_CHARS else value[:_SHOWN_CHARS] + "..."
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _has_control(text: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


def is_plain_name(name: str) -> bool:
    """A model name that can only ever name a direct child of the repository."""
    return (isinstance(name, str) and bool(name) and not name.startswith(".") and "/" not in name
            and "\\" not in name and not _has_control(name) and len(name.encode("utf-8", "replace")) <= MAX_NAME_BYTES)


def relative_parts(value: str) -> tuple[str, ...] | None:
    """The components of a relative path that stays below its base by its text alone, else None."""
    if not isinstance(value, str) or not value or "\\" in value or _has_control(value) or value.startswith("/"):
        return None
    parts = PurePosixPath(value).parts
    if not parts or ".." in parts:
        return None
    return parts


def outside_message(model: str, what: str, value: str) -> str:
    return f"model '{shown(model)}': {what} '{shown(value)}' must be a relative path inside the model directory"


def check_relative(model: str, what: str, value: str) -> tuple[str, ...]:
    parts = relative_parts(value)
    if parts is None:
        raise PathNotAllowed(outside_message(model, what, value))
    return parts


def confine(base: Path, value: str, *, model: str, what: str) -> Path:
    """`value` (relative to `base`) as a real path inside `base`'s real path; PathNotAllowed otherwise."""
    parts = check_relative(model, what, value)
    real_base = os.path.realpath(base)
    target = os.path.realpath(os.path.join(real_base, *parts))
    if not target.startswith(real_base.rstrip(os.sep) + os.sep):
        raise PathNotAllowed(outside_message(model, what, value))
    return Path(target)


def open_model_file(model_dir: Path, relative: str, *, model: str, what: str) -> BinaryIO:
    """A regular file inside the model directory (`relative`, confined to it: PathNotAllowed otherwise), opened for
    reading without following a link or waiting on a FIFO; OSError where it cannot be, or is not a regular file."""
    path = confine(model_dir, relative, model=model, what=what)
    fh = os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW), "rb")
    if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
        fh.close()
        raise OSError("not a regular file")
    return fh


def read_model_file(model_dir: Path, relative: str, *, model: str, what: str, limit: int, where: str) -> bytes:
    """A regular file of at most `limit` bytes inside the model directory (`open_model_file`), read; else a
    ConfigError that starts with `where` and names `what`."""
    try:
        with open_model_file(model_dir, relative, model=model, what=what) as fh:
            raw = fh.read(limit + 1)
    except OSError:
        raise ConfigError(f"{where}: {what} '{shown(relative)}' cannot be read") from None
    if len(raw) > limit:
        raise ConfigError(f"{where}: {what} is larger than {limit} bytes")
    return raw


def check_config_paths(cfg: mc.ModelConfig, model: str) -> None:
    """Every file name a model config carries, checked by its text before anything touches the disk."""
    if cfg.default_model_filename:
        check_relative(model, "default_model_filename", cfg.default_model_filename)
    for key, filename in cfg.cc_model_filenames.items():
        check_relative(model, f"cc_model_filenames['{shown(key)}']", filename)
    for out in cfg.output:
        if out.label_filename:
            check_relative(model, "label_filename", out.label_filename)
    for warmup in cfg.model_warmup:
        for tensor, data in warmup.inputs.items():
            if data.HasField("input_data_file"):
                check_relative(model, f"model_warmup input '{shown(tensor)}' input_data_file", data.input_data_file)
    for state in cfg.sequence_batching.state:
        for initial in state.initial_state:
            if initial.data_file:
                check_relative(model, f"state '{shown(state.input_name)}' initial_state data_file", initial.data_file)
    for library in cfg.model_operations.op_library_filename:
        if not library or _has_control(library):
            raise PathNotAllowed(f"model '{shown(model)}': model_operations op_library_filename '{shown(library)}' "
                                 "must be a non-empty path without control characters")


def check_request_libraries(cfg: mc.ModelConfig, model: str, allowed: frozenset[str]) -> None:
    """A load request's config may name only the custom-operator libraries the operator allowed
    (server.op_libraries): registering one runs its code in the server. The repository's own configs are the
    operator's, and may name any."""
    for library in cfg.model_operations.op_library_filename:
        if library not in allowed:
            raise PathNotAllowed(f"model '{shown(model)}': model_operations op_library_filename '{shown(library)}' "
                                 "is not one the server allows a load request to name (server.op_libraries, "
                                 "--op-library); put the config in the model repository or ask the operator")


class UploadArea:
    """Model files uploaded with a load request, each load in a fresh directory under one directory of
    this process (mode 0700, named for its pid and start time), which close() removes; sweep_stale()
    removes those of processes that are gone."""

    def __init__(self, parent: Path | None = None) -> None:
        self.parent = Path(parent) if parent is not None else Path(tempfile.gettempdir())
        self._root: Path | None = None

    @property
    def root(self) -> Path | None:
        return self._root

    def write(self, model: str, files: dict[str, bytes]) -> Path:
        """A fresh directory holding `files` ({"file:REL/PATH": bytes}); nothing is left behind on failure."""
        checked = [(key, check_relative(model, "file override", key[len("file:"):])) for key in files]
        directory = Path(tempfile.mkdtemp(prefix="load_", dir=self._ensure_root()))
        try:
            for key, parts in checked:
                target = directory.joinpath(*parts)
                try:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with open(target, "xb") as fh:  # exclusive: two keys naming one file are refused
                        fh.write(files[key])
                except OSError:
                    raise PathNotAllowed(f"model '{shown(model)}': file override '{shown(key)}' clashes with "
                                         "another file override or cannot be written") from None
        except BaseException:
            self.remove(directory)
            raise
        return directory

    def remove(self, directory: Path) -> None:
        if self._root is not None and Path(directory).parent == self._root:
            shutil.rmtree(directory, ignore_errors=True)

    def close(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def _ensure_root(self) -> Path:
        if self._root is None or not self._root.is_dir():
            self.parent.mkdir(parents=True, exist_ok=True)
            me = os.getpid()
            prefix = f"{UPLOAD_PREFIX}{me}_{_process_start(me) or 'x'}_"
            self._root = Path(tempfile.mkdtemp(prefix=prefix, dir=self.parent))
        return self._root

    def sweep_stale(self) -> list[Path]:
        """Remove upload directories that processes of this user left behind when they died."""
        removed = []
        try:
            candidates = list(self.parent.glob(f"{UPLOAD_PREFIX}*"))
        except OSError:
            return removed
        for path in candidates:
            if path != self._root and _is_stale(path):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        if removed:
            log.info("removed %d upload directories left by earlier runs", len(removed))
        return removed


def _process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux /proc), "" where it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[19]
    except (OSError, IndexError):
        return ""


def _is_stale(path: Path) -> bool:
    """A real directory of this user named for a process (pid and start time) that no longer runs."""
    pid_text, _, rest = path.name[len(UPLOAD_PREFIX):].partition("_")
    start_text = rest.partition("_")[0]
    if not pid_text.isdigit():
        return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return False
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    now_start = _process_start(pid)
    return bool(start_text.isdigit() and now_start) and now_start != start_text  # the pid was reused
