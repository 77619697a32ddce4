"""The CUDA runtime on a GPU; skipped where there is none (CI). The GPU machine runs the
same checks over the whole tiny zoo with benchmarks/gpu_check.py."""
import numpy as np
import pytest

from tilefuse.errors import PlanError


def _gpu_available() -> bool:
    try:
        from cuda.bindings import driver
    except ImportError:
        return False
    err, = driver.cuInit(0)[:1]
    if err != driver.CUresult.CUDA_SUCCESS:
        return False
    err, n = driver.cuDeviceGetCount()
    return err == driver.CUresult.CUDA_SUCCESS and n > 0


def test_missing_cuda_python_is_a_clear_error(monkeypatch):
    import sys

    from tilefuse.runtime import cuda

    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    with pytest.raises(PlanError, match="cuda-python"):
        cuda._driver()


@pytest.mark.skipif(not _gpu_available(), reason="no CUDA GPU here")
def test_mlp_plan_matches_onnxruntime_on_the_gpu(tmp_path, zoo_cache):
    import onnxruntime as ort

    import models
    from tilefuse.compare import compare_output
    from tilefuse.compiler import compile
    from tilefuse.runtime import InferenceSession

    shapes = models.ZOO["mlp"].shapes("tiny")
    path = models.build("mlp", "tiny", "float32", cache_dir=zoo_cache)
    compile(path, "cuda:sm_90a", shapes).save(tmp_path / "m.tfplan")
    feeds = models.random_inputs(path, shapes, seed=int(np.random.default_rng().integers(2**31)))
    got = InferenceSession(tmp_path / "m.tfplan").run(None, feeds)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        assert compare_output("y", g, w).ok


@pytest.mark.skipif(not _gpu_available(), reason="no CUDA GPU here")
def test_gpu_tensors_in_and_out_without_host_copies(tmp_path, zoo_cache):
    """torch CUDA tensors as feeds: the outputs stay on the GPU (DeviceArray, readable by
    torch through __cuda_array_interface__) and equal the host path's."""
    torch = pytest.importorskip("torch")
    import models
    from tilefuse.compiler import compile
    from tilefuse.runtime import DeviceArray, InferenceSession

    shapes = models.ZOO["mlp"].shapes("tiny")
    path = models.build("mlp", "tiny", "float32", cache_dir=zoo_cache)
    compile(path, "cuda:sm_90a", shapes).save(tmp_path / "m.tfplan")
    sess = InferenceSession(tmp_path / "m.tfplan")
    feeds = models.random_inputs(path, shapes, seed=int(np.random.default_rng().integers(2**31)))
    host = sess.run(None, feeds)
    device = sess.run(None, {k: torch.from_numpy(v).cuda() for k, v in feeds.items()})
    for h, d in zip(host, device):
        assert isinstance(d, DeviceArray)
        np.testing.assert_array_equal(torch.as_tensor(d, device="cuda").cpu().numpy(), h)
        np.testing.assert_array_equal(d.numpy(), h)
