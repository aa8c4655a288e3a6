"""One deployment end to end (roofline kernels): every engine serves every request, and an
infeasible layout is refused with its reasons."""

from __future__ import annotations

import numpy as np
import pytest

from opcast.archs import load_arch
from opcast.errors import OpcastError
from opcast.hardware import get_device
from opcast.predict.cost import roofline_only
from opcast.predict.parallel import InferConfig
from opcast.predict.serve.deployment import predict_serve
from opcast.predict.serve.engine import ENGINES, engine_defaults
from opcast.predict.serve.requests import Lengths, poisson_stream


def _stream(rate: float = 50.0):
    return poisson_stream(
        rate_per_s=rate,
        num_requests=300,
        input_len=Lengths("uniform", 16, 512),
        output_len=Lengths("uniform", 1, 64),
        seed=0,
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_serves_every_request(engine):
    dev = get_device("H100-SXM")
    stream = _stream()
    r = predict_serve(
        load_arch("gpt3-125m"),
        dev,
        InferConfig(tp=1),
        engine_defaults(engine, dev),
        stream,
        replicas=2,
        kernels=roofline_only("test"),
        slo_ttft_s=1.0,
        slo_tpot_s=0.1,
    )
    assert np.isfinite(r.sim.finish_s).all()
    assert sum(s.tokens_out for s in r.sim.steps) == stream.output_tokens.sum()
    m = r.metrics
    assert m.ttft.p50_s > 0 and m.tpot.p50_s > 0 and m.e2e.p99_s >= m.e2e.p50_s
    assert m.output_tokens_per_s == pytest.approx(stream.output_tokens.sum() / m.duration_s)
    assert r.cost_sources == ("roofline",)
    if engine == "trtllm":
        assert m.preemptions == 0


def test_more_load_means_longer_waits():
    dev = get_device("H100-SXM")
    arch, cfg, engine = load_arch("llama3-8b"), InferConfig(tp=1), engine_defaults("vllm", dev)
    kernels = roofline_only("test")
    light, heavy = (
        predict_serve(arch, dev, cfg, engine, _stream(rate), kernels=kernels).metrics for rate in (2.0, 400.0)
    )
    assert heavy.ttft.p90_s > 5 * light.ttft.p90_s
    assert heavy.tpot.p50_s > light.tpot.p50_s


def test_an_infeasible_layout_is_refused_with_every_reason():
    dev = get_device("H100-SXM")
    with pytest.raises(OpcastError, match=r"infeasible configuration: .*tp=5"):
        predict_serve(
            load_arch("llama3-8b"),
            dev,
            InferConfig(tp=5),
            engine_defaults("vllm", dev),
            _stream(),
            kernels=roofline_only("test"),
        )
