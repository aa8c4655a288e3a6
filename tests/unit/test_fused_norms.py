"""Fused norms (issue 21): the compulsory traffic the registry counts for one-pass kernels, and the
physical bounds of a learned norm taken from the devices that measured its implementation only
(``impl_devices`` of a predictor entry), so that a training device that measured another
implementation neither anchors nor escapes the bounds."""

from __future__ import annotations

import numpy as np
import pytest

from opcast.hardware import device_to_dict, get_device
from opcast.predict.cost import kernel, peak_roofline_s
from opcast.predict.cost.learned import SPAN, LearnedKernelCost, _impl_devices

A100, A40, GH200, H200 = (get_device(n) for n in ("A100-SXM4-80GB", "A40", "GH200", "H200"))
ROWS, COLS, DT = 16384, 8192, 2


@pytest.mark.parametrize(
    ("kind", "direction", "expected"),
    [
        # x read, y written; gamma (and beta) read once; fp32 statistics written per row
        ("rmsnorm", "fwd", DT * (2 * ROWS * COLS + COLS) + 4 * ROWS),
        ("layernorm", "fwd", DT * (2 * ROWS * COLS + 2 * COLS) + 8 * ROWS),
        # x and dy read, dx written; gamma read and dgamma (dbeta) written; saved statistics read
        ("rmsnorm", "bwd", DT * (3 * ROWS * COLS + 2 * COLS) + 4 * ROWS),
        ("layernorm", "bwd", DT * (3 * ROWS * COLS + 4 * COLS) + 8 * ROWS),
        ("softmax", "fwd", DT * 2 * ROWS * COLS),  # x read, y written
        ("softmax", "bwd", DT * 3 * ROWS * COLS),  # y and dy read, dx written
    ],
)
def test_a_fused_kernel_moves_its_compulsory_bytes_once(kind, direction, expected):
    k = kernel(kind, {"rows": ROWS, "cols": COLS, "impl": "fused"}, "bf16", direction)
    assert k.bytes_moved() == expected


class _Set:
    """A model set answering a fixed utilisation of the memory roofline per device."""

    def __init__(self, entry, utilisation):
        names = (A100, A40, GH200)
        self.meta = {
            "predictors": {"rmsnorm-fwd-half": entry},
            "device_specs": {d.name: device_to_dict(d) for d in names},
        }
        self.utilisation = utilisation

    def covers(self, *key):
        return True

    def predict_s(self, cols, device):
        ks = [
            kernel("rmsnorm", {"rows": int(r), "cols": int(c), "impl": str(i)}, "bf16")
            for r, c, i in zip(cols["rows"], cols["cols"], cols["impl"])
        ]
        return np.array([peak_roofline_s(k, device)[0] / self.utilisation[device.name] for k in ks])


ENTRY = {
    "features": ["log_rows", "impl_code"],
    "feature_ranges": {"impl_code": [3.0, 4.0]},
    "devices": [A100.name, A40.name, GH200.name],
}
UTIL = {A100.name: 0.35, A40.name: 0.60, GH200.name: 0.20, H200.name: 0.10}
FUSED = kernel("rmsnorm", {"rows": ROWS, "cols": COLS, "impl": "fused"}, "bf16")


def _bounded(entry, device):
    src = LearnedKernelCost(_Set(entry, UTIL), "fake")
    t = src.predict_s([FUSED], device)
    times, why = src.bound([FUSED], t, device)
    return peak_roofline_s(FUSED, device)[0] / times[0], why.get(FUSED), src


def test_without_impl_devices_every_training_device_anchors_the_bounds():
    u, why, _ = _bounded(ENTRY, H200)
    assert u == pytest.approx(0.20) and why[0] == SPAN  # GH200's extrapolated fused answer is the reference


def test_a_training_device_without_data_of_the_impl_is_no_reference():
    entry = {**ENTRY, "impl_devices": {"fused": [A100.name, A40.name], "unfused": [A100.name, GH200.name]}}
    u, why, src = _bounded(entry, H200)
    assert u == pytest.approx(0.35) and why[0] == SPAN and "GH200" not in why[1]  # A100 and A40 only
    # on GH200 itself the fused answer is an extrapolation: flagged, and held to the devices that measured it
    assert "GH200" not in src.range.fitted_on("rmsnorm-fwd-half", "fused")
    assert src.out_of_range([FUSED], GH200)
    u, why, _ = _bounded(entry, GH200)
    assert u == pytest.approx(0.35) and why is not None
    # the unfused kernel still has GH200 among its training devices
    assert GH200.name in src.range.fitted_on("rmsnorm-fwd-half", "unfused")


def test_an_impl_without_devices_is_not_spoken_for_and_a_malformed_record_is_ignored():
    src = LearnedKernelCost(_Set({**ENTRY, "impl_devices": {"unfused": [A100.name]}}, UTIL), "fake")
    assert not src.covers(FUSED)
    assert any("no data of impl fused" in n for n in src.range.notes)
    assert _impl_devices({"impl_devices": {"fused": "A100"}}) == {}
    assert _impl_devices({"impl_devices": ["fused"]}) == {}
    assert _impl_devices({}) == {}


def test_the_fit_records_which_devices_measured_each_implementation():
    import pandas as pd

    from opcast.train.fit import _impl_devices as fitted_impl_devices

    frame = pd.DataFrame(
        {
            "device": ["A100-SXM4-80GB", "A40", "GH200", "A100-SXM4-80GB"],
            "impl": ["fused", "fused", "unfused", "unfused"],
        }
    )
    assert fitted_impl_devices(frame) == {
        "impl_devices": {"fused": ["A100-SXM4-80GB", "A40"], "unfused": ["A100-SXM4-80GB", "GH200"]}
    }
    assert fitted_impl_devices(frame.drop(columns="impl")) == {}
    assert fitted_impl_devices(frame.assign(impl=None)) == {}
