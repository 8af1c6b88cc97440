"""Express plans, shared by the HTTP and gRPC express lanes (protocol/http_express.py, grpc_express.py).

A client that sends one request over and over with new tensor data (perf_analyzer, tritonclient with fixed shapes)
has each request decoded from a skeleton, checked once per form, queued, and answered from an answer template. Once
one such request has been served that way, what the next ones need is fixed: the loaded model, where each input lies
in the message, the checked batch size and shape key, which outputs go back, and the answer's encoded head by output
shapes. A `Plan` holds that; an express lane serves a later request from it, straight from the transport's callback
to the model's queue and from the future's callback back to the transport (issue #17, DESIGN-NOTES departure 17).

`plannable` says whether a request served the full way may be planned: made from a skeleton, no
classification, no parameters but `binary_data_output` (the data plane neither echoes nor pops it), and the data
plane serving its model straight from its queue (`DataPlane.express_model`). The transports add their own conditions
(tracing off; no compression, no deadline of the call's own, the token right) before they learn or serve.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import numpy as np

from ..errors import GtServeError
from ..types import InferRequest, Tensor

now_ns = time.monotonic_ns  # the clock of DataPlane.express_failed
ANSWER_SHAPES = 16  # answers kept per plan, by output shapes (a model with dynamic output dims has several)
_PLANNED_PARAMETERS = frozenset({"binary_data_output"})


def plannable(dataplane: Any, request: InferRequest) -> tuple[Any, tuple, tuple | None] | None:
    """(loaded model, its checked form, the returned outputs' indices in model order or None for all) when
    `request`, just served the full way, may be planned; else None."""
    form = request.form
    if form is None or not _PLANNED_PARAMETERS.issuperset(form.params) or request.deadline_s:
        return None
    model = dataplane.express_model(request.model_name, request.model_version)
    checked = None if model is None else model.checked_forms.get(form)
    if checked is None:  # not checked on this model
        return None
    requested = checked[2]
    if requested is None:
        return model, checked, None
    if any(o.parameters.get("classification") is not None for o in requested):
        return None
    order = model.spec.output_order
    return model, checked, tuple(order.index(o.name) for o in requested)


class Plan:
    """What a request of one planned form needs; `inputs`: (name, numpy dtype, elements, start in the message,
    shape) per input with data in the message, the starts the transport's; `shm_inputs`: the inputs in system
    shared memory (tensors without data), read for each request; `requested`: the checked requested outputs (None:
    all), `shm_outputs` whether any is written to a region (the answer is then made as the full path makes it)."""

    __slots__ = ("model", "name", "version", "inputs", "batch_size", "shape_key", "priority", "picks", "names",
                 "datatypes", "request", "answers", "shm_inputs", "requested", "shm_outputs", "regions")

    def __init__(self, model: Any, request: InferRequest, checked: tuple, picks: tuple | None, starts) -> None:
        form = request.form
        spec = model.spec
        self.model = model
        self.name, self.version = request.model_name, request.model_version
        self.inputs = tuple((name, dtype, count, start, shape) for (name, _, shape, _, dtype, count), start
                            in zip([entry for entry in form.inputs if entry[4] is not None], starts))
        self.shm_inputs = tuple(Tensor(name, datatype, shape, None, params)
                                for name, datatype, shape, params, dtype, _ in form.inputs if dtype is None)
        self.requested = checked[2]
        self.shm_outputs = self.requested is not None and any(o.in_shared_memory for o in self.requested)
        self.regions = bool(self.shm_inputs) or self.shm_outputs  # looked up for each request
        self.batch_size, self.shape_key = checked[0], checked[1]
        self.priority = form.priority
        self.picks = picks
        self.names = tuple(spec.output_order if picks is None else [spec.output_order[i] for i in picks])
        self.datatypes = tuple(spec.outputs[n].datatype for n in self.names)
        # what an answer's encoding reads of a request: its id (the transport's, for a plan keyed without the id),
        # requested outputs and parameters (no data)
        self.request = InferRequest(request.model_name, request.model_version, request.id, [], form.outputs,
                                    dict(form.params))
        self.answers: dict[tuple, Any] = {}  # output shapes -> the transport's encoded answer head

    def feeds(self, buffer) -> dict:
        """The request's inputs, as arrays over `buffer` (the message)."""
        return {name: np.frombuffer(buffer, dtype, count, start).reshape(shape)
                for name, dtype, count, start, shape in self.inputs}

    def submit(self, dataplane: Any, model: Any, buffer) -> Any:
        """The request in `buffer` (the message) queued on `model` (`express_model`'s, this plan's): its future; None
        when the queue refuses it (a full queue, an unloading model: the full path gives that error and counts it).
        A bug below is answered as the full path answers one: the future holds it."""
        try:
            feeds = self.feeds(buffer)
            if self.regions:  # inputs read, output regions looked up: what fails there, the full path answers
                feeds.update(dataplane.express_regions(self.shm_inputs, self.requested))
            if self.batch_size == 1:  # run at once when the queue would run it on the loop anyway
                done = dataplane.express_run(model, feeds, self.shape_key)
                if done is not None:
                    return done
            return dataplane.express_submit(model, feeds, self.batch_size, self.shape_key, self.priority)
        except GtServeError:
            return None
        except Exception as exc:  # noqa: BLE001 - see above
            future = asyncio.get_running_loop().create_future()
            future.set_exception(exc)
            return future

    def outputs(self, arrays: list) -> list:
        """The returned outputs of a batch's per-request result (model order), in the answer's order (model order
        still for a plan with outputs in shared memory: `DataPlane.express_outputs` takes them so)."""
        picks = self.picks
        return arrays if picks is None or self.shm_outputs else [arrays[i] for i in picks]

    def tensors(self, outputs: list) -> list[Tensor]:
        """The response's tensors, as DataPlane's make_outputs makes them for this form."""
        return [Tensor(n, t, a.shape, a) for n, t, a in zip(self.names, self.datatypes, outputs)]

    def keep_answer(self, shapes: tuple, head: Any) -> None:
        if len(self.answers) < ANSWER_SHAPES:
            self.answers[shapes] = head


def settle(future, plan: Plan, request_id: str, dataplane: Any, start_ns: int,
           answer: Callable[[Plan, str, list], Any], failed: Callable[[BaseException], Any],
           reply: Callable[[Any], None]) -> None:
    """An express request's future is done: `reply` with `answer(plan, its id, its outputs)`, or with `failed(error)` (a
    GtServeError counted as the full path counts it; anything else, a bug, answered all the same); nothing when it
    was cancelled (its call or connection went away)."""
    if future.cancelled():
        return
    try:
        exc = future.exception()
        if exc is None:
            result = answer(plan, request_id, plan.outputs(future.result()))
        else:
            if isinstance(exc, GtServeError):
                dataplane.express_failed(plan.model, start_ns, exc)
            result = failed(exc)
    except Exception as exc:  # noqa: BLE001 - the request must get an answer
        if isinstance(exc, GtServeError):  # an output's region gone since: counted as the full path counts it
            dataplane.express_failed(plan.model, start_ns, exc)
        result = failed(exc)
    reply(result)
