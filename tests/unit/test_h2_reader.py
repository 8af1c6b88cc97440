"""protocol/h2/reader.FrameReader: frames out of received chunks, however the bytes are cut, with large DATA
payloads as views of what was received (no copy) and every other payload as bytes."""
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
