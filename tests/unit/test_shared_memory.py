"""gt_serve.core.shared_memory: key / offset / size validation and the checks on the opened object.

The registry is pointed at the test's tmp directory (its shm root), so nothing touches /dev/shm here;
tests/security/test_shared_memory.py attacks a real server through the real /dev/shm.
"""
from __future__ import annotations

import os

import pytest

from gt_serve.core.shared_memory import MAX_KEPT, MAX_KEY_BYTES, SystemSharedMemory, check_extent, check_key
from gt_serve.errors import AlreadyExists, Code, InvalidArgument

SIZE_BYTES = 64


@pytest.fixture
def root(tmp_path):
    shm_root = tmp_path / "shm"
    shm_root.mkdir()
    (shm_root / "region").write_bytes(bytes(range(SIZE_BYTES)))
    return shm_root


@pytest.fixture
def shm(root):
    return SystemSharedMemory(str(root))


@pytest.mark.parametrize("key, name", [("/region", "region"), ("region", "region"), ("/a.b-c_d", "a.b-c_d"),
                                       ("/" + "k" * MAX_KEY_BYTES, "k" * MAX_KEY_BYTES)])
def test_good_keys(key, name):
    assert check_key(key) == name


@pytest.mark.parametrize("key, words", [
    ("", ["'key'", "non-empty"]),
    ("/", ["'key'", "no further '/'"]),
    ("//x", ["no further '/'"]),
    ("/a/b", ["no further '/'"]),
    ("/../etc/passwd", ["no further '/'"]),
    ("/..", ["no further '/'"]),
    ("/.", ["no further '/'"]),
    ("/a\x00b", ["NUL"]),
    ("/" + "k" * (MAX_KEY_BYTES + 1), ["256 bytes", "limit is 255"]),
    ("/" + "é" * 128, ["256 bytes"]),
    ("/\udc80", ["UTF-8"]),
    (None, ["'key'"]),
    (7, ["'key'"]),
])
def test_bad_keys_name_the_key(key, words):
    with pytest.raises(InvalidArgument) as err:
        check_key(key, "region 'r'")
    assert err.value.code is Code.INVALID_ARGUMENT
    for w in ["region 'r'", *words]:
        assert w in err.value.message


@pytest.mark.parametrize("value", ["abc", "1", 1.5, -1, 2**63, 2**64, True, None, [1], {"a": 1}])
def test_bad_extents_name_the_field(value):
    with pytest.raises(InvalidArgument, match="'offset' must be a non-negative integer"):
        check_extent("offset", value, "what")


def test_extent_bounds():
    assert check_extent("offset", 0, "w") == 0
    assert check_extent("offset", 2**63 - 1, "w") == 2**63 - 1
    with pytest.raises(InvalidArgument, match="'byte_size' must be a positive integer"):
        check_extent("byte_size", 0, "w", minimum=1)


def test_register_read_write_round_trip(shm, root):
    shm.register("r", "/region", 8, 32)
    assert shm.status("r") == [{"name": "r", "key": "/region", "offset": 8, "byte_size": 32}]
    assert shm.read("r", 4, 4, "IN") == bytes([12, 13, 14, 15])
    shm.write("r", 0, b"\xff" * 4, 8, "OUT")
    assert (root / "region").read_bytes()[8:16] == b"\xff" * 4 + bytes([12, 13, 14, 15])


@pytest.mark.parametrize("args, words", [
    (("r", "/region", "abc", 8), ["'offset'", "'abc'"]),
    (("r", "/region", -1, 8), ["'offset'", "-1"]),
    (("r", "/region", 0, 2**64), ["'byte_size'"]),
    (("r", "/region", 0, 0), ["'byte_size'"]),
    (("r", "/region", 0, "8"), ["'byte_size'"]),
    (("r", "/region", 60, 8), ["68 bytes", "64-byte"]),
    (("r", "/region", 2**63 - 1, 2**63 - 1), ["64-byte"]),
    (("r", "/missing", 0, 8), ["does not exist"]),
    (("r", "/a\x00b", 0, 8), ["NUL"]),
    (("", "/region", 0, 8), ["name must not be empty"]),
    (("n" * 1025, "/region", 0, 8), ["limit is 1024"]),
])
def test_bad_registrations_are_invalid_arguments(shm, args, words):
    with pytest.raises(InvalidArgument) as err:
        shm.register(*args)
    for w in words:
        assert w in err.value.message
    assert shm.status() == []


def test_duplicate_name_is_refused(shm):
    shm.register("r", "/region", 0, 8)
    with pytest.raises(AlreadyExists, match="already registered"):
        shm.register("r", "region", 0, 8)
    assert shm.status("r")[0]["key"] == "/region"


def test_symlink_is_refused_at_registration_and_at_use(shm, root, tmp_path):
    target = tmp_path / "victim"
    target.write_bytes(b"secret" * 16)
    (root / "link").symlink_to(target)
    with pytest.raises(InvalidArgument, match="symbolic link"):
        shm.register("r", "/link", 0, 8)
    # a registered key swapped for a symlink afterwards: both directions refused, the target untouched
    shm.register("s", "/region", 0, 8)
    (root / "region").unlink()
    (root / "region").symlink_to(target)
    with pytest.raises(InvalidArgument, match="symbolic link"):
        shm.read("s", 0, 8, "IN")
    with pytest.raises(InvalidArgument, match="symbolic link"):
        shm.write("s", 0, b"x" * 8, 8, "OUT")
    assert target.read_bytes() == b"secret" * 16


def test_fifo_and_directory_are_refused_without_blocking(shm, root):
    os.mkfifo(root / "fifo")  # a blocking open() of a FIFO without a writer would hang the server
    (root / "dir").mkdir()
    for key in ("/fifo", "/dir"):
        with pytest.raises(InvalidArgument, match="not a regular shared memory object|unable to open"):
            shm.register("r", key, 0, 1)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")
def test_other_owner_is_refused(shm, root):
    os.chown(root / "region", 65534, 65534)
    with pytest.raises(InvalidArgument, match="owned by uid 65534"):
        shm.register("r", "/region", 0, 8)


def test_truncated_after_registration_is_refused_and_not_regrown(shm, root):
    shm.register("r", "/region", 0, SIZE_BYTES)
    os.truncate(root / "region", 16)
    with pytest.raises(InvalidArgument, match="exceeds the 16-byte"):
        shm.read("r", 0, SIZE_BYTES, "IN")
    with pytest.raises(InvalidArgument, match="exceeds the 16-byte"):
        shm.write("r", 32, b"x" * 8, 8, "OUT")
    assert os.path.getsize(root / "region") == 16
    assert shm.read("r", 0, 16, "IN") == bytes(range(16))  # what is still there stays usable


@pytest.mark.parametrize("offset, nbytes, words", [
    ("8", 8, ["'shared_memory_offset'"]),
    (-1, 8, ["'shared_memory_offset'"]),
    (0, "8", ["'shared_memory_byte_size'"]),
    (0, None, ["'shared_memory_byte_size'"]),
    (2**63, 8, ["'shared_memory_offset'"]),
    (4, 8, ["outside shared memory region 'r'"]),
])
def test_bad_tensor_extents_are_invalid_arguments(shm, offset, nbytes, words):
    shm.register("r", "/region", 0, 8)
    for call in (lambda: shm.read("r", offset, nbytes, "IN"), lambda: shm.check("r", offset, nbytes, "output 'O'"),
                 lambda: shm.write("r", offset, b"", nbytes, "OUT")):
        with pytest.raises(InvalidArgument) as err:
            call()
        for w in words:
            assert w in err.value.message


def test_unknown_or_malformed_region_names(shm):
    for name in ("nope", ["r"], None, {"a": 1}):
        with pytest.raises(InvalidArgument, match="is not registered"):
            shm.read(name, 0, 1, "IN")


def test_output_larger_than_its_capacity_is_refused(shm):
    shm.register("r", "/region", 0, 16)
    with pytest.raises(InvalidArgument, match="12 bytes do not fit the 8 bytes"):
        shm.write("r", 0, b"x" * 12, 8, "OUT")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_kept_descriptor_serves_reads_and_writes(shm, root, monkeypatch):
    shm.register("r", "/region", 0, SIZE_BYTES)
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    for i in range(5):
        assert shm.read("r", 0, 4, "IN") == (bytes([9] * 4) if i else bytes(range(4)))
        shm.write("r", 0, bytes([9] * 4), 4, "OUT")
    assert len(opened) == 1  # once more to write (registration opened it read-only), then neither


def test_a_refused_registration_keeps_nothing_open(shm, root):
    before = open_fds()
    with pytest.raises(InvalidArgument, match="exceeds the 64-byte"):
        shm.register("r", "/region", 60, 8)
    assert open_fds() == before and shm.status() == []
    shm.register("ok", "/region", 0, 8)
    with pytest.raises(InvalidArgument, match="exceeds the 64-byte"):  # another region on the same key: kept
        shm.register("r", "/region", 60, 8)
    assert open_fds() == before + 1 and shm.read("ok", 0, 8, "IN") == bytes(range(8))


def test_a_recreated_object_is_opened_afresh(shm, root):
    shm.register("r", "/region", 0, 8)
    assert shm.read("r", 0, 8, "IN") == bytes(range(8))
    (root / "region").unlink()  # the client recreates its region under the same key
    (root / "region").write_bytes(b"\xaa" * 16)
    assert shm.read("r", 0, 8, "IN") == b"\xaa" * 8
    shm.write("r", 0, b"\x01" * 8, 8, "OUT")
    assert (root / "region").read_bytes() == b"\x01" * 8 + b"\xaa" * 8
    (root / "region").unlink()
    with pytest.raises(InvalidArgument, match="does not exist"):
        shm.read("r", 0, 8, "IN")


def test_kept_descriptors_are_bounded_and_closed_with_their_regions(shm, root):
    before = open_fds()
    for i in range(MAX_KEPT + 8):
        (root / f"k{i}").write_bytes(bytes([i]) * 8)
        shm.register(f"r{i}", f"/k{i}", 0, 8)
    assert open_fds() - before == MAX_KEPT
    assert shm.read("r0", 0, 8, "IN") == bytes(8)  # one let go is opened again
    assert open_fds() - before == MAX_KEPT
    shm.register("again", "/k3", 0, 8)  # two regions on one key share its descriptor
    shm.unregister("r3")
    assert shm.read("again", 0, 8, "IN") == bytes([3]) * 8
    shm.unregister()
    assert open_fds() == before


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")
def test_an_object_given_away_after_registration_is_refused(shm, root):
    shm.register("r", "/region", 0, 8)
    assert shm.read("r", 0, 8, "IN") == bytes(range(8))
    os.chown(root / "region", 65534, 65534)
    with pytest.raises(InvalidArgument, match="owned by uid 65534"):
        shm.read("r", 0, 8, "IN")
    with pytest.raises(InvalidArgument, match="owned by uid 65534"):
        shm.write("r", 0, b"x" * 8, 8, "OUT")
