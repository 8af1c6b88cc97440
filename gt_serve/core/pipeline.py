"""Pipelines: a model split into ordered stages (see gt_serve.tools.shard), served as one model.

Stage i's outputs feed stage i+1's inputs by tensor name. The pipeline keeps every tensor it has
seen (the request's inputs and each stage's outputs), so a stage may also read a graph input or an
earlier cut. Each stage request goes through the data plane's `infer`, so a stage runs here or on
the peer the fleet router picks, with the same re-routing when a peer fails.

A pipeline is addressable like a model: ready when every stage is ready here or served by a live
peer; metadata = stage 0's inputs and the last stage's outputs; its config is built the same way.
What a stage looks like (metadata and config) is read from the local registry, or asked of a peer
that serves it once and then kept.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Mapping

from ..errors import GtServeError, InvalidArgument, ModelNotFound, PeerUnavailable, Unavailable
from ..types import InferRequest, InferResponse, Tensor
from .ensemble import run_dag, step_request

PIPELINE_PLATFORM = "pipeline"
SERVED_BY_PARAMETER = "gt_served_by"
STAGES_SERVED_BY_PARAMETER = "gt_stages_served_by"  # "node0,node1,...": who ran each stage


@dataclass(frozen=True, slots=True)
class Pipeline:
    name: str
    stages: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.stages or any(not isinstance(s, str) or not s for s in self.stages):
            raise ValueError(f"pipeline '{self.name}': stages must be a non-empty list of model names")


@dataclass(frozen=True, slots=True)
class StageInfo:
    """What the pipeline needs of a stage model: its V2 metadata and its model config."""

    metadata: Mapping[str, Any]
    config: Any  # model_config_pb2.ModelConfig

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t["name"] for t in self.metadata.get("inputs", ()))


# hooks the data plane provides
LocalInfo = Callable[[str], "StageInfo | None"]  # stage model -> its info when ready here
PeerTargets = Callable[[str], list]  # stage model -> live peers serving it (PeerTarget-like, with .node)
DescribePeer = Callable[[Any, str], Awaitable[StageInfo]]  # (peer, model) -> its info; PeerUnavailable
Infer = Callable[[InferRequest], Awaitable[InferResponse]]


class PipelineSet:
    def __init__(self, pipelines: Iterable[Pipeline], *, local_info: LocalInfo, peer_targets: PeerTargets,
                 describe_peer: Callable[[], DescribePeer | None], infer: Infer, node: str = "") -> None:
        self._pipelines = {p.name: p for p in pipelines}
        for p in self._pipelines.values():
            nested = [s for s in p.stages if s in self._pipelines]
            if nested:
                raise ValueError(f"pipeline '{p.name}': stage '{nested[0]}' is a pipeline (stages are models)")
        self._local_info = local_info
        self._peer_targets = peer_targets
        self._describe_peer = describe_peer
        self._infer = infer
        self._node = node
        self._remote: dict[str, StageInfo] = {}  # stage model -> info a peer gave

    def __contains__(self, name: str) -> bool:
        return name in self._pipelines

    def names(self) -> list[str]:
        return sorted(self._pipelines)

    def get(self, name: str) -> Pipeline:
        return self._pipelines[name]

    # -- model-like surface -------------------------------------------------------------------
    def ready(self, name: str, version: str = "") -> bool:
        if version not in ("", "1"):
            return False
        return all(self._local_info(s) is not None or self._peer_targets(s) for s in self._pipelines[name].stages)

    async def metadata(self, name: str, version: str = "") -> dict:
        p = self._get(name, version)
        first, last = await self._info(p, 0), await self._info(p, len(p.stages) - 1)
        return {"name": p.name, "versions": ["1"], "platform": PIPELINE_PLATFORM,
                "inputs": [dict(t) for t in first.metadata.get("inputs", ())],
                "outputs": [dict(t) for t in last.metadata.get("outputs", ())]}

    async def config(self, name: str, version: str = ""):
        p = self._get(name, version)
        first, last = await self._info(p, 0), await self._info(p, len(p.stages) - 1)
        cfg = type(first.config)()
        cfg.name = p.name
        cfg.platform = PIPELINE_PLATFORM
        cfg.max_batch_size = min(int(first.config.max_batch_size), int(last.config.max_batch_size))
        cfg.input.extend(first.config.input)
        cfg.output.extend(last.config.output)
        return cfg

    # -- inference ------------------------------------------------------------------------------
    async def infer(self, request: InferRequest) -> InferResponse:
        """The stages as a linear DAG on the ensemble engine (core/ensemble.run_dag): a stage starts when
        the tensors it reads exist, so a stage that reads only request inputs need not wait."""
        p = self._get(request.model_name, request.model_version)
        infos = [await self._info(p, i) for i in range(len(p.stages))]
        wanted = {n for info in infos for n in info.input_names}
        for t in request.inputs:
            if t.name not in wanted:
                raise InvalidArgument(f"unexpected inference input '{t.name}' for pipeline '{p.name}'")
        reads = self._linear_reads(p, infos, {t.name for t in request.inputs})
        served_by, last, answer = [self._node] * len(p.stages), len(p.stages) - 1, []

        async def run_stage(i: int, pool: Mapping[str, Tensor]) -> dict[str, Tensor]:
            stage = p.stages[i]
            sub = step_request(request, stage, "", [_renamed(pool[key], n) for n, key in reads[i]],
                               request.outputs if i == last else None)
            try:
                response = await self._infer(sub)
            except GtServeError as exc:
                if isinstance(exc, (InvalidArgument, ModelNotFound)):
                    self._remote.pop(stage, None)  # the stage may have changed shape: ask again next time
                exc.message = f"pipeline '{p.name}' stage {i} ('{stage}'): {exc.message}"
                raise
            served_by[i] = str(response.parameters.get(SERVED_BY_PARAMETER, self._node))
            if i == last:
                answer.append(response)
            return {_produced(t.name, i): t for t in response.outputs} if i != last else {}

        await run_dag([[key for _, key in r] for r in reads], {t.name: t for t in request.inputs}, run_stage)
        return InferResponse(p.name, "1", request.id, answer[0].outputs, {STAGES_SERVED_BY_PARAMETER: ",".join(served_by)})

    @staticmethod
    def _linear_reads(p: Pipeline, infos: list[StageInfo], given: set[str]) -> list[list[tuple[str, str]]]:
        """Per stage, (its input, the pool key it reads): the latest earlier stage giving that name, else
        the request's tensor; a name neither provides is the client's error, found before any stage runs."""
        latest: dict[str, str] = {n: n for n in given}
        reads = []
        for i, (stage, info) in enumerate(zip(p.stages, infos)):
            missing = [n for n in info.input_names if n not in latest]
            if missing:
                raise InvalidArgument(f"pipeline '{p.name}' stage {i} ('{stage}') needs input(s) {missing}: "
                                      "neither the request nor an earlier stage provides them")
            reads.append([(n, latest[n]) for n in info.input_names])
            latest.update({t["name"]: _produced(t["name"], i) for t in info.metadata.get("outputs", ())})
        return reads

    # -- stage descriptions -------------------------------------------------------------------------
    def _get(self, name: str, version: str) -> Pipeline:
        p = self._pipelines.get(name)
        if p is None or version not in ("", "1"):
            raise ModelNotFound(f"Request for unknown model: '{name}'"
                                + (f" version {version}" if version else "") + " is not found")
        return p

    async def _info(self, p: Pipeline, index: int) -> StageInfo:
        stage = p.stages[index]
        info = self._local_info(stage)
        if info is not None:
            return info
        info = self._remote.get(stage)
        if info is not None:
            return info
        describe = self._describe_peer()
        failures = []
        for target in (self._peer_targets(stage) if describe is not None else ()):
            try:
                info = await describe(target, stage)
            except PeerUnavailable as exc:
                failures.append(str(exc))
                continue
            self._remote[stage] = info
            return info
        raise Unavailable(f"pipeline '{p.name}': stage {index} ('{stage}') is not ready here and no live peer "
                          "serves it" + (": " + "; ".join(failures) if failures else ""))


def _produced(name: str, stage: int) -> str:
    """The pool key of tensor `name` given by `stage` (a later stage may give the same name again)."""
    return f"{name}\x00{stage}"


def _renamed(t: Tensor, name: str) -> Tensor:
    return t if t.name == name else Tensor(name, t.datatype, t.shape, t.data)
