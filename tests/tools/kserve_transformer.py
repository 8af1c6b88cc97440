"""A KServe transformer as KServe's docs write one, in front of gt-serve as its predictor: run by
tests/tools/test_kserve_sdk.py with the Python of the client SDKs' venv
(tests/tools/client_sdks.py), never imported by pytest.

    python kserve_transformer.py --model_name simple --predictor_host HOST:PORT --predictor_protocol v2|grpc-v2
        --enable_predictor_health_check --http_port P --grpc_port Q

`preprocess` doubles INPUT0; KServe's Model.predict sends the request on to the predictor with KServe's own
clients, and with the health check on, the transformer is ready only while the predictor says it is."""
from __future__ import annotations

import argparse

from kserve import InferInput, InferRequest, Model, ModelServer, model_server
from kserve.model import PredictorConfig


class Doubler(Model):
    def __init__(self, name: str, predictor_config: PredictorConfig):
        super().__init__(name, predictor_config)
        self.ready = True

    def preprocess(self, payload: InferRequest, headers=None) -> InferRequest:
        inputs = []
        for tensor in payload.inputs:
            data = tensor.as_numpy()
            if tensor.name == "INPUT0":
                data = data * 2
            doubled = InferInput(tensor.name, list(data.shape), tensor.datatype)
            doubled.set_data_from_numpy(data)
            inputs.append(doubled)
        return InferRequest(model_name=self.name, infer_inputs=inputs, request_id=payload.id)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(parents=[model_server.parser])
    args, _ = parser.parse_known_args()
    config = PredictorConfig(args.predictor_host, args.predictor_protocol, args.predictor_use_ssl,
                             args.predictor_request_timeout_seconds, args.predictor_request_retries,
                             args.enable_predictor_health_check)
    ModelServer().start([Doubler(args.model_name, config)])
