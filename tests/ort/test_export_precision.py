"""export-ort --precision (issue 17, item 6): a float32 model exported with fp16 kernels runs
in onnxruntime with float32 inputs and outputs, within fp16's tolerance of the float32
model, and the kernels really compute in half floats (they differ from the fp32 export)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import models
from tilefuse.ort import export_ort

from tests.ort.helpers import export_session


@pytest.mark.parametrize("mode", ["ep", "custom-ops"])
def test_a_float32_model_exports_with_half_kernels(mode, tmp_path, zoo_cache, ep_options):
    path = models.build("bert", "tiny", "float32", cache_dir=zoo_cache)
    shapes = models.ZOO["bert"].shapes("tiny")
    feeds = models.random_inputs(path, shapes, seed=3)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    half = export_ort(path, tmp_path / "fp16", shapes=shapes, mode=mode, precision="fp16")
    full = export_ort(path, tmp_path / "fp32", shapes=shapes, mode=mode)
    assert all(p.precision == "fp16" for p in half.plans) and all(p.precision == "fp32" for p in full.plans)
    got = export_session(half, ep_options).run(None, feeds)
    exact = export_session(full, ep_options).run(None, feeds)
    for g, e, w in zip(got, exact, want):
        assert g.dtype == np.float32 and g.shape == w.shape
        scale = max(1.0, float(np.abs(w).max()))
        assert np.abs(g - w).max() <= 1e-2 * scale  # fp16's tolerance
        assert np.abs(e - w).max() <= 1e-4 * scale
    assert any(np.abs(g - e).max() > 1e-6 for g, e in zip(got, exact))  # the half kernels ran
