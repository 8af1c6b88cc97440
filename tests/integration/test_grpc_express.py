"""The gRPC express lane (protocol/grpc_express.py, our own transport) against the full path: two real servers in
this process, one with `server.express` (the default) and one without, sent the same ModelInfer messages as raw
bytes over real grpcio channels, so that the answers' bytes, statuses and trailers can be compared as they are.
"""
from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from gt_serve.app import App
from tests.conftest import assert_same_counts, in_process_server
from tests.models import GATHER_TABLE, gather_repository

TIMEOUT_S = 30.0
INFER = "/inference.GRPCInferenceService/ModelInfer"
TABLE = np.array(GATHER_TABLE, dtype=np.float32)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return gather_repository(tmp_path_factory.mktemp("grpc_express_repo"))


@contextlib.asynccontextmanager
async def serving(repo: Path, **server):
    async with in_process_server(repo, allow_http=False, **server) as app:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.ports['grpc']}")
        try:
            yield app, channel.unary_unary(INFER)  # bytes in, bytes out
        finally:
            await channel.close()


def served(app: App) -> int:
    lanes = [m[3] for m in app.grpc.methods.values() if m[3] is not None]
    return lanes[0].served if lanes else -1


def message(model: str, inputs: dict, *, outputs: list[str] | None = None, request_id: str = "",
            version: str = "") -> bytes:
    req = pb.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    for name, (datatype, array) in inputs.items():
        tensor = req.inputs.add(name=name, datatype=datatype)
        tensor.shape.extend(array.shape)
        req.raw_input_contents.append(array.tobytes())
    for name in outputs or ():
        req.outputs.add(name=name)
    return req.SerializeToString()


async def call(infer, data: bytes, **kw) -> tuple:
    """(status code, details, trailing metadata, answer bytes or None); no deadline unless `timeout` is given (a
    call with one is not served from a plan; pytest's own timeout bounds the test)."""
    try:
        answer = await infer(data, **kw)
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details(), tuple(exc.trailing_metadata() or ()), None
    return grpc.StatusCode.OK, "", (), answer


def simple(rng, **kw) -> tuple[bytes, np.ndarray, np.ndarray]:
    a, b = (rng.integers(-1000, 1000, (1, 16), dtype=np.int32) for _ in range(2))
    return message("simple", {"INPUT0": ("INT32", a), "INPUT1": ("INT32", b)}, **kw), a, b


def gather(index: int, model: str = "gather") -> bytes:
    return message(model, {"INDICES": ("INT64", np.array([[index]], np.int64))})


async def stats(app: App, model: str) -> dict:
    return (await app.dataplane.statistics(model))["model_stats"][0]


async def cancel_once_queued(app: App, before: int, cancel, what: str) -> None:
    """Once the express lane has taken `what` (its count past `before`: the server's state in this process), `cancel()`
    it, and wait until the server has seen that: its request's future done, and purged from gather_pair's queue."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT_S
    while served(app) == before:
        assert loop.time() < deadline, f"{what} was never served from its plan"
        await asyncio.sleep(0.005)
    cancel()
    batcher = app.dataplane.express_model("gather_pair").executor.batcher
    while True:
        batcher.purge_done()
        if not batcher.pending:
            break
        assert loop.time() < deadline, f"{what} stayed queued after its cancel"
        await asyncio.sleep(0.005)


@pytest.mark.asyncio
async def test_same_bytes_and_statistics_as_the_full_path(repo):
    forms = [{}, {"outputs": ["OUTPUT1", "OUTPUT0"]}, {"outputs": ["OUTPUT1"]}, {"request_id": "req-7"},
             {"version": "1"}]
    rng = np.random.default_rng(3)
    async with serving(repo) as (fast, fast_infer), serving(repo, express=False) as (full, full_infer):
        assert served(full) == -1
        for kw in forms:
            for _ in range(6):
                data, a, b = simple(rng, **kw)
                got, want = await call(fast_infer, data), await call(full_infer, data)
                assert got[0] == grpc.StatusCode.OK and got == want
                answer = pb.ModelInferResponse.FromString(got[3])
                expect = {"OUTPUT0": a + b, "OUTPUT1": a - b}
                for out, raw in zip(answer.outputs, answer.raw_output_contents):
                    assert np.array_equal(np.frombuffer(raw, np.int32).reshape(1, 16), expect[out.name])
        # each form: the first decoded in full, the second learns its skeleton, the third its plan; but the form
        # with an id is keyed without it, as the form {} is: its skeleton is known, its first message plans it
        assert served(fast) == len(forms) * 3 + 2
        got, want = await stats(fast, "simple"), await stats(full, "simple")
        assert_same_counts(got, want)
        assert got["inference_stats"]["success"]["count"] == len(forms) * 6


@pytest.mark.asyncio
async def test_a_failed_run_gives_the_full_paths_status_and_count(repo):
    async with serving(repo) as (fast, fast_infer), serving(repo, express=False) as (full, full_infer):
        for index in (1, 2, 3, 4):
            got, want = await call(fast_infer, gather(index)), await call(full_infer, gather(index))
            assert got[0] == grpc.StatusCode.OK and got == want
        before = served(fast)
        got, want = await call(fast_infer, gather(100)), await call(full_infer, gather(100))
        assert served(fast) == before + 1
        assert got == want and got[0] == grpc.StatusCode.INTERNAL
        assert got[1].startswith("model 'gather': inference failed on lane cpu.")
        got, want = await call(fast_infer, gather(9)), await call(full_infer, gather(9))
        assert got[0] == grpc.StatusCode.OK and got == want
        got, want = await stats(fast, "gather"), await stats(full, "gather")
        assert got["inference_stats"]["fail"]["count"] == want["inference_stats"]["fail"]["count"] == 1
        assert got["inference_stats"]["success"]["count"] == want["inference_stats"]["success"]["count"] == 5


@pytest.mark.asyncio
async def test_calls_and_stream_messages_that_come_one_at_a_time_run_at_once(repo):
    """One call or stream message at a time: once the form is planned and its row's run time known, each runs at once
    on the loop (ModelExecutor.run_now), a failed run included. Answers and statistics are those of a server that
    queues every request (lanes.inline_max_us 0)."""
    # any run of this model is short enough to run on the loop: that rule is not what is tested here
    async with serving(repo, environ={"GT_LANES__INLINE_MAX_US": "1000000"}) as (fast, fast_infer), \
            serving(repo, express=False, environ={"GT_LANES__INLINE_MAX_US": "0"}) as (full, full_infer):
        for index in (1, 2, 3):  # the form planned, its row's run time measured
            assert await call(fast_infer, gather(index)) == await call(full_infer, gather(index))
        executor = fast.dataplane.express_model("gather").executor
        executor._gap_ns = 10**12  # how far apart requests come is timing, covered by the unit tests
        before = executor.ran["at_once"]
        for index in (4, 100, 5):  # 100: out of range, the run fails
            got, want = await call(fast_infer, gather(index)), await call(full_infer, gather(index))
            assert got == want and got[0] == (grpc.StatusCode.INTERNAL if index == 100 else grpc.StatusCode.OK)
        answers = {}
        for app in (fast, full):
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.ports['grpc']}")
            stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")()
            answers[app] = []
            for index in (6, 7, 8):
                await stream.write(gather(index))
                answers[app].append(await asyncio.wait_for(stream.read(), TIMEOUT_S))
            await stream.done_writing()
            assert await stream.code() == grpc.StatusCode.OK
            await channel.close()
        assert answers[fast] == answers[full]
        assert executor.ran["at_once"] == before + 6
        assert full.dataplane.express_model("gather").executor.ran["at_once"] == 0
        got, want = await stats(fast, "gather"), await stats(full, "gather")
        assert_same_counts(got, want)
        assert got["inference_stats"]["fail"]["count"] == 1 and got["inference_stats"]["success"]["count"] == 8


@pytest.mark.asyncio
async def test_a_message_run_at_once_is_answered_before_serve_returns(repo):
    """A message run at once (a lone row) is answered from `GrpcExpress.serve` itself, so that the connection writes
    the answer as its read of the message ends, not a loop turn later; a queued one from its batch's completion."""
    for inline_max_us, at_once in (("1000000", True), ("0", False)):
        async with serving(repo, environ={"GT_LANES__INLINE_MAX_US": inline_max_us}) as (app, infer):
            for index in (1, 2, 3):  # the form planned, its row's run time measured
                want = await call(infer, gather(index))
            app.dataplane.express_model("gather").executor._gap_ns = 10**12  # requests far apart
            express = [m[3] for m in app.grpc.methods.values() if m[3] is not None][0]
            replies: list = []
            future = express.serve(gather(3), False, replies.append)
            assert future is not None and future.done() is at_once and len(replies) == int(at_once)
            await future
            await asyncio.sleep(0)  # a queued message's answer: the future's done callback, ahead of this task's
            assert len(replies) == 1 and b"".join(replies[0]) == want[3]
            if at_once:  # an answer that fails is logged, as from a done callback: the request is not run again
                executor = app.dataplane.express_model("gather").executor
                before = executor.ran["at_once"]

                def broken(pieces) -> None:
                    raise RuntimeError("the connection's answer failed")
                assert express.serve(gather(3), False, broken) is not None and executor.ran["at_once"] == before + 1


@pytest.mark.asyncio
async def test_deadlines_compression_and_tokens_take_the_full_path(repo):
    """A call with a deadline of its own, a compressed message and a wrong token are never served from a plan:
    each gets the full path's answer or status; a plain call with the token is."""
    rng = np.random.default_rng(9)
    token = (("authorization", "Bearer s3cret"),)
    async with serving(repo, auth_token="s3cret") as (fast, fast_infer), \
            serving(repo, auth_token="s3cret", express=False) as (full, full_infer):
        data, _, _ = simple(rng)

        async def both(**kw) -> tuple:
            got, want = await call(fast_infer, data, **kw), await call(full_infer, data, **kw)
            assert got == want
            return got

        for _ in range(3):
            assert (await both(metadata=token))[0] == grpc.StatusCode.OK
        before = served(fast)
        assert (await both(metadata=token, timeout=20))[0] == grpc.StatusCode.OK
        assert (await both(metadata=token, compression=grpc.Compression.Gzip))[0] == grpc.StatusCode.OK
        assert (await both(metadata=(("authorization", "Bearer nope"),)))[0] == \
            grpc.StatusCode.UNAUTHENTICATED
        assert served(fast) == before
        assert (await both(metadata=token))[0] == grpc.StatusCode.OK
        assert served(fast) == before + 1


@pytest.mark.asyncio
async def test_a_cancelled_call_costs_nobody_else(repo):
    """`gather_pair` runs two requests together and keeps a lone one waiting: a client cancels its call while it
    waits; the next pair is answered, each with its own rows, and only the answered requests are counted."""
    async with serving(repo) as (app, infer):
        async def pair(i: int, j: int) -> list:
            return await asyncio.gather(call(infer, gather(i, "gather_pair")),
                                        call(infer, gather(j, "gather_pair")))

        for i, j in ((1, 2), (3, 4)):  # learn the plan
            assert [r[0] for r in await pair(i, j)] == [grpc.StatusCode.OK] * 2
        before = served(app)
        lone = infer(gather(7, "gather_pair"))
        await cancel_once_queued(app, before, lone.cancel, "the lone call")
        answers = await pair(5, 6)
        for index, (code, _, _, raw) in zip((5, 6), answers):
            assert code == grpc.StatusCode.OK
            answer = pb.ModelInferResponse.FromString(raw)
            assert np.array_equal(np.frombuffer(answer.raw_output_contents[0], np.float32), TABLE[index])
        assert (await stats(app, "gather_pair"))["inference_stats"]["success"]["count"] == 6


@pytest.mark.asyncio
async def test_a_reloaded_or_unloaded_model_is_not_served_from_an_old_plan(repo):
    rng = np.random.default_rng(11)
    async with serving(repo, model_control_mode="explicit", load_models=("simple",)) as (app, infer):
        async def one() -> tuple:
            data, a, b = simple(rng)
            got = await call(infer, data)
            if got[0] == grpc.StatusCode.OK:
                answer = pb.ModelInferResponse.FromString(got[3])
                assert np.array_equal(np.frombuffer(answer.raw_output_contents[0], np.int32).reshape(1, 16), a + b)
            return got

        for _ in range(4):
            assert (await one())[0] == grpc.StatusCode.OK
        assert served(app) == 1
        await app.dataplane.load_model("simple", {})
        assert (await one())[0] == grpc.StatusCode.OK
        assert served(app) == 1  # a new model: the full path, which plans it again
        assert (await one())[0] == grpc.StatusCode.OK
        assert served(app) == 2
        await app.dataplane.unload_model("simple")
        code, details, _, _ = await one()
        assert code != grpc.StatusCode.OK and "simple" in details
        assert served(app) == 2


@pytest.mark.asyncio
async def test_stream_messages_are_answered_as_the_full_path_answers_them(repo):
    """ModelStreamInfer: messages of one planned form, one of them failing in onnxruntime's run, sent one at a time
    on one stream to each server: the same answers, byte for byte (a failure as the stream's error answer, the
    stream going on), the same counts."""
    indices = [1, 2, 3, 4, 100, 5, 6]
    async with serving(repo) as (fast, _), serving(repo, express=False) as (full, _):
        answers = {}
        for app in (fast, full):
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.ports['grpc']}")
            call = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")()
            got = []
            for index in indices:
                await call.write(gather(index))
                got.append(await asyncio.wait_for(call.read(), TIMEOUT_S))
            await call.done_writing()
            assert await call.code() == grpc.StatusCode.OK
            await channel.close()
            answers[app] = got
        assert answers[fast] == answers[full]
        for index, raw in zip(indices, answers[fast]):
            answer = pb.ModelStreamInferResponse.FromString(raw)
            if index == 100:
                assert answer.error_message.startswith("model 'gather': inference failed on lane cpu.")
            else:
                assert not answer.error_message
                out = answer.infer_response.raw_output_contents[0]
                assert np.array_equal(np.frombuffer(out, np.float32), TABLE[index])
        assert served(fast) == len(indices) - 3  # the third message's answer planned the form
        got, want = await stats(fast, "gather"), await stats(full, "gather")
        for key in ("success", "fail"):
            assert got["inference_stats"][key]["count"] == want["inference_stats"][key]["count"], key


@pytest.mark.asyncio
async def test_each_message_gets_its_own_id_from_one_plan(repo):
    """Messages that differ in their ids alone are served from one plan (one per message length), each answered
    with its own id, byte for byte as the full path answers it; a message without an id shares the plan of ids of
    no length."""
    numbered = ["8", "9", "10", "11", "12", "13"]
    uuids = [f"3f2b8a1e-7c4d-4e0f-9a6b-2d1c5e8f7a{i:02d}" for i in range(6)]
    not_plain = ["caf\u00e9", "caf\u00e9", 'q"1', 'q"1', "x" * 128, "", "", ""]
    rng = np.random.default_rng(17)
    async with serving(repo) as (fast, fast_infer), serving(repo, express=False) as (full, full_infer):
        for request_id in numbered + uuids + not_plain:
            data, a, b = simple(rng, request_id=request_id)
            got, want = await call(fast_infer, data), await call(full_infer, data)
            assert got[0] == grpc.StatusCode.OK and got == want
            answer = pb.ModelInferResponse.FromString(got[3])
            assert answer.id == request_id
            assert np.array_equal(np.frombuffer(answer.raw_output_contents[1], np.int32).reshape(1, 16), a - b)
        # "8" decoded in full, "9" teaches the skeleton (keyed without the id), "10" the plan of two-digit ids;
        # "11"-"13" express; the first UUID teaches the plan of its length, the other five express; ids that are
        # not plain are keys of their own, each seen at most twice; the first message without an id (the skeleton
        # known) teaches its plan, the other two express
        assert served(fast) == 3 + 5 + 2


async def open_stream(app: App):
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.ports['grpc']}")
    return channel, channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")()


@pytest.mark.asyncio
async def test_stream_messages_in_flight_are_all_answered_before_the_status(repo):
    """Messages served from their plan beside the stream's handler (grpc_native: `_stream_express`), written back to
    back and the stream half-closed at once: every one answered, with its own id and rows, and then the OK status."""
    async with serving(repo) as (app, _):
        channel, call = await open_stream(app)
        for index in (1, 2, 3):  # learn the plan (of two-character ids), one at a time
            await call.write(message("gather", {"INDICES": ("INT64", np.array([[index]], np.int64))},
                                     request_id=str(90 + index)))
            assert not pb.ModelStreamInferResponse.FromString(await asyncio.wait_for(call.read(), TIMEOUT_S)) \
                .error_message
        before = served(app)
        sent = {str(10 + i): i % 8 for i in range(24)}
        for request_id, index in sent.items():
            await call.write(message("gather", {"INDICES": ("INT64", np.array([[index]], np.int64))},
                                     request_id=request_id))
        await call.done_writing()
        got = {}
        while (raw := await asyncio.wait_for(call.read(), TIMEOUT_S)) is not grpc.aio.EOF:
            answer = pb.ModelStreamInferResponse.FromString(raw)
            assert not answer.error_message
            got[answer.infer_response.id] = np.frombuffer(answer.infer_response.raw_output_contents[0], np.float32)
        assert await call.code() == grpc.StatusCode.OK
        await channel.close()
        assert served(app) - before == len(sent) and sorted(got) == sorted(sent)
        for request_id, index in sent.items():
            assert np.array_equal(got[request_id], TABLE[index])


@pytest.mark.asyncio
async def test_a_cancelled_stream_costs_nobody_else(repo):
    """A stream cancelled while a message served from its plan waits (`gather_pair` keeps a lone one waiting): the
    server forgets it, and the next pair of unary calls is answered, each with its own rows."""
    async with serving(repo) as (app, infer):
        for i, j in ((1, 2), (3, 4)):  # learn the plan
            answers = await asyncio.gather(call(infer, gather(i, "gather_pair")), call(infer, gather(j, "gather_pair")))
            assert [r[0] for r in answers] == [grpc.StatusCode.OK] * 2
        channel, stream = await open_stream(app)
        before = served(app)
        await stream.write(gather(7, "gather_pair"))
        await cancel_once_queued(app, before, stream.cancel, "the stream's message")
        await channel.close()
        answers = await asyncio.gather(call(infer, gather(5, "gather_pair")), call(infer, gather(6, "gather_pair")))
        for index, (code, _, _, raw) in zip((5, 6), answers):
            assert code == grpc.StatusCode.OK
            answer = pb.ModelInferResponse.FromString(raw)
            assert np.array_equal(np.frombuffer(answer.raw_output_contents[0], np.float32), TABLE[index])
        assert (await stats(app, "gather_pair"))["inference_stats"]["success"]["count"] == 6


def shm_gather(out_region: str, in_offset: int) -> bytes:
    """A gather_pair ModelInfer whose INDICES are read from region `in` at `in_offset` and whose OUTPUT is written to
    `out_region` (perf_analyzer --shared-memory system's layout: no raw_input_contents at all)."""
    req = pb.ModelInferRequest(model_name="gather_pair")
    tensor = req.inputs.add(name="INDICES", datatype="INT64", shape=[1, 1])
    tensor.parameters["shared_memory_region"].string_param = "in"
    tensor.parameters["shared_memory_offset"].int64_param = in_offset
    tensor.parameters["shared_memory_byte_size"].int64_param = 8
    out = req.outputs.add(name="OUTPUT")
    out.parameters["shared_memory_region"].string_param = out_region
    out.parameters["shared_memory_byte_size"].int64_param = 16
    return req.SerializeToString()


@pytest.mark.asyncio
async def test_inputs_and_outputs_in_shared_memory_are_served_from_plans(repo):
    """Pairs of gather_pair calls with INDICES read from a region and OUTPUT written to one, each server with its
    own regions under the same names: the full path's answers, rows and statistics; an output region unregistered
    while its request waits in the queue fails that request at its answer, as the full path fails it."""
    import tritonclient.grpc.aio as grpcclient
    import tritonclient.utils.shared_memory as shm

    tag = f"gt_grpc_express_{id(repo)}"
    sizes = {"in": 16, "outA": 16, "outB": 16}
    handles = {}
    try:
        for server in ("fast", "full"):
            for region, size in sizes.items():
                handles[server, region] = shm.create_shared_memory_region(f"{tag}_{server}_{region}",
                                                                          f"/{tag}_{server}_{region}", size)
        async with serving(repo) as (fast, fast_infer), serving(repo, express=False) as (full, full_infer):
            servers = {"fast": (fast, fast_infer), "full": (full, full_infer)}
            clients = {s: grpcclient.InferenceServerClient(f"127.0.0.1:{app.ports['grpc']}")
                       for s, (app, _) in servers.items()}
            for server, client in clients.items():
                for region, size in sizes.items():
                    await client.register_system_shared_memory(region, f"/{tag}_{server}_{region}", size)
            first, second = shm_gather("outA", 0), shm_gather("outB", 8)
            for i, j in ((1, 2), (3, 4), (5, 6), (7, 8), (9, 0)):
                answers = {}
                for server, (app, infer) in servers.items():
                    shm.set_shared_memory_region(handles[server, "in"], [np.array([[i], [j]], np.int64)])
                    answers[server] = await asyncio.gather(call(infer, first), call(infer, second))
                    for index, region in ((i, "outA"), (j, "outB")):
                        row = shm.get_contents_as_numpy(handles[server, region], np.float32, [1, 1, 4])
                        assert np.array_equal(row.reshape(4), TABLE[index]), (server, region)
                assert answers["fast"] == answers["full"]
                assert [a[0] for a in answers["fast"]] == [grpc.StatusCode.OK] * 2
            assert served(fast) == 4  # pairs 1-2 decoded in full, pair 3 planned each form, pairs 4-5 express
            results = {}
            for server, (app, infer) in servers.items():
                lone = asyncio.ensure_future(call(infer, first))
                batcher = app.dataplane.express_model("gather_pair").executor.batcher
                loop = asyncio.get_running_loop()
                deadline = loop.time() + TIMEOUT_S
                while not batcher.pending:  # queued, waiting for its partner (the server's state in this process)
                    assert loop.time() < deadline, "the lone call was never queued"
                    await asyncio.sleep(0.005)
                await clients[server].unregister_system_shared_memory("outA")
                partner = await call(infer, second)
                results[server] = (await asyncio.wait_for(lone, TIMEOUT_S), partner)
            assert results["fast"] == results["full"]
            (code, details, _, _), partner = results["fast"]
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "outA" in details
            assert partner[0] == grpc.StatusCode.OK
            assert served(fast) == 6
            for client in clients.values():
                await client.unregister_system_shared_memory()
                await client.close()
            got, want = await stats(fast, "gather_pair"), await stats(full, "gather_pair")
            assert_same_counts(got, want)
            assert got["inference_stats"]["fail"]["count"] == 1
    finally:
        for handle in handles.values():
            shm.destroy_shared_memory_region(handle)
