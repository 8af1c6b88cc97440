"""protocol/h2/reader.FrameReader: frames out of received chunks, however the bytes are cut, with large DATA
payloads as views of what was received (no copy) and every other payload as bytes; the rest of a large frame read
straight into its buffer (`into`, `filled`) once a quarter of it has come."""
from __future__ import annotations

import os
import random

import pytest

from gt_serve.protocol.h2 import frames as f
from gt_serve.protocol.h2.reader import FrameReader


def _drain(reader: FrameReader) -> list[tuple]:
    out = []
    while (frame := reader.next_frame()) is not None:
        out.append(frame)
    return out


def _plain(frames_: list[tuple]) -> list[tuple]:
    return [(kind, flags, sid, bytes(payload)) for kind, flags, sid, payload in frames_]


@pytest.mark.parametrize("seed", range(40))
def test_any_cut_of_the_bytes_gives_the_same_frames(seed):
    rng = random.Random(seed)
    sent = [(rng.choice([f.DATA, f.DATA, f.HEADERS, f.SETTINGS, f.PING, f.WINDOW_UPDATE]), rng.randint(0, 255),
             rng.randint(0, 2**31 - 1), os.urandom(rng.choice([0, 1, 9, 100, 16383, 16384, 40000, 65536])))
            for _ in range(rng.randint(1, 10))]
    wire = b"".join(f.frame(kind, flags, sid, payload) for kind, flags, sid, payload in sent)
    reader = FrameReader(65536, view_min=rng.choice([1, 16384]))
    got, pos = [], 0
    while pos < len(wire):
        step = rng.choice([1, 3, 9, 10, 100, 5000, 65545, 262144])
        into = reader.into()
        if into is not None and rng.random() < 0.7:  # read into the frame's buffer, as a buffered transport does
            piece = wire[pos:pos + min(step, len(into))]
            into[:len(piece)] = piece
            reader.filled(len(piece))
            step = len(piece)
        else:
            reader.feed(wire[pos:pos + step])
        pos += step
        while rng.random() < 0.8:  # sometimes stop reading (a write pause) while more arrives
            frame = reader.next_frame()
            if frame is None:
                break
            got.append(frame)
    got += _drain(reader)
    assert _plain(got) == sent
    assert reader.pending == 0


def test_a_large_data_payload_is_a_view_of_what_was_received():
    payload = os.urandom(65536)
    chunk = f.frame(f.DATA, 0, 1, payload) + f.frame(f.PING, 0, 0, b"12345678")
    reader = FrameReader(65536)
    reader.feed(chunk)
    data, ping = _drain(reader)
    assert isinstance(data[3], memoryview) and data[3].obj is chunk and data[3] == payload
    assert type(ping[3]) is bytes and ping[3] == b"12345678"


def test_small_payloads_and_payloads_in_a_much_larger_chunk_are_copied():
    """A view keeps its whole chunk alive: only a payload of a quarter of its chunk or more is one."""
    small = f.frame(f.DATA, 0, 1, b"x" * 100)
    big = f.frame(f.DATA, 0, 3, b"y" * 20000)
    reader = FrameReader(65536)
    reader.feed(small + big + f.frame(f.DATA, 0, 5, b"z" * 65536))
    frames_ = _drain(reader)
    assert [type(fr[3]) for fr in frames_] == [bytes, bytes, memoryview]


def test_a_frame_cut_across_chunks_is_whole_and_the_rest_is_read_in_place():
    first = os.urandom(40000)
    second = os.urandom(65536)
    wire = f.frame(f.DATA, 0, 1, first) + f.frame(f.DATA, 0, 3, second)
    cut = 20000
    reader = FrameReader(65536)
    reader.feed(wire[:cut])
    assert reader.next_frame() is None and reader.pending == cut
    rest = wire[cut:]
    reader.feed(rest)
    one, two = _drain(reader)
    assert bytes(one[3]) == first and bytes(two[3]) == second
    assert isinstance(two[3], memoryview) and two[3].obj is rest  # not copied to get past the cut


def test_an_oversized_frame_is_refused_from_its_header():
    reader = FrameReader(16384)
    reader.feed(f.frame_head(16385, f.DATA, 0, 1))
    with pytest.raises(f.H2ConnectionError) as err:
        reader.next_frame()
    assert err.value.code == f.FRAME_SIZE_ERROR and "16385" in err.value.message


def test_a_header_cut_in_the_middle_waits_for_its_rest():
    wire = f.frame(f.PING, 0, 0, b"abcdefgh")
    reader = FrameReader(16384)
    for i in range(len(wire) - 1):
        reader.feed(wire[i:i + 1])
        assert reader.next_frame() is None
    reader.feed(wire[-1:])
    assert _plain(_drain(reader)) == [(f.PING, 0, 0, b"abcdefgh")]


def test_the_rest_of_a_large_frame_is_read_into_its_buffer_once_a_quarter_came():
    payload = os.urandom(200000)
    wire = f.frame(f.DATA, 0, 1, payload) + f.frame(f.PING, 0, 0, b"12345678")
    reader = FrameReader(1 << 20)
    reader.feed(wire[:9 + 1000])  # the header and less than a quarter: no frame's worth allocated for it
    assert reader.next_frame() is None and reader.into() is None and reader.pending == 9 + 1000
    reader.feed(wire[9 + 1000:60000])
    assert reader.next_frame() is None and reader.pending == 60000
    into = reader.into()  # a quarter came: the whole frame's buffer, its rest to be read into
    assert into is not None and len(into) == 9 + len(payload) - 60000
    into[:100000] = wire[60000:160000]
    reader.filled(100000)
    assert reader.pending == 160000 and reader.next_frame() is None
    into = reader.into()
    assert len(into) == 9 + len(payload) - 160000
    rest = 9 + len(payload) - 160000
    into[:] = wire[160000:160000 + rest]
    reader.filled(rest)
    data = reader.next_frame()
    assert data[:3] == (f.DATA, 0, 1) and data[3] == payload
    assert isinstance(data[3], memoryview) and len(data[3].obj) == 9 + len(payload)  # no copy of the frame made
    assert reader.into() is None and reader.pending == 0
    reader.feed(wire[160000 + rest:])
    assert _plain(_drain(reader)) == [(f.PING, 0, 0, b"12345678")]


def test_nothing_is_read_into_a_buffer_while_received_bytes_wait_or_for_a_small_frame():
    big = f.frame(f.DATA, 0, 1, os.urandom(100000))
    reader = FrameReader(1 << 20)
    reader.feed(big[:50000])
    assert reader.next_frame() is None and reader.into() is not None
    reader.feed(big[50000:60000])  # came through `feed` (a transport that is not buffered): read from there first
    assert reader.into() is None
    assert reader.next_frame() is None and reader.into() is not None
    small = FrameReader(1 << 20)
    small.feed(f.frame(f.DATA, 0, 1, b"x" * 10000)[:5000])  # under view_min: grows as it comes
    assert small.next_frame() is None and small.into() is None


def test_a_whole_frame_buffer_is_given_again_only_once_nothing_refers_to_it():
    import numpy as np

    from gt_serve.protocol.reusable_buffers import ReusableBuffers

    buffers = ReusableBuffers(keep_bytes=4000)
    first = buffers.take(1000)
    second = buffers.take(1000)
    assert second is not first  # held here
    first_id, second_id = id(first), id(second)
    view = memoryview(first)[9:]
    del first
    array = np.frombuffer(view[100:], np.uint8)  # an array over a view of it
    del view, second
    third = buffers.take(1000)
    assert id(third) == second_id  # the first is still under the array
    del third, array
    assert id(buffers.take(999)) not in (first_id, second_id)  # another size: a new one
    assert id(buffers.take(1000)) == first_id  # nothing over it any more
    held = [buffers.take(1000) for _ in range(6)]  # all in use at once: new ones past the two free, the oldest
    assert len(set(map(id, held))) == 6 and first_id in map(id, held)  # forgotten to keep 4000 bytes at most
    assert sum(map(len, buffers._kept)) <= 4000


def test_frames_of_one_size_read_one_after_another_reuse_a_buffer():
    payload = os.urandom(100000)
    wire = f.frame(f.DATA, 0, 1, payload)
    reader = FrameReader(1 << 20)
    seen = set()
    for _ in range(3):
        reader.feed(wire[:50000])
        reader.feed(wire[50000:])
        data = reader.next_frame()
        assert data[3] == payload
        seen.add(id(data[3].obj))
        del data
    assert len(seen) == 1
