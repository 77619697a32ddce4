"""Out-of-range indices inside onnxruntime: the custom-op library and the plugin execution
provider (on the CPU, and the CUDA provider on the stand-in driver, fake_libcuda.c) fail
the node with onnxruntime's INVALID_ARGUMENT and tilefuse's message, which names the
graph input, the ONNX node and the value; the session stays usable, and valid negative
indices give plain onnxruntime's answer. Before the checks a BERT export fed input_ids of
2**40 crashed the process, so every run is in a child process."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.compiler.index_cases import BERT_SHAPES, EXAMPLE, REPO, bert_feeds, bert_message
from tests.ort.helpers import as_fake_cuda
from tilefuse.ort import export_ort

CHILD = r"""
import json, sys
import numpy as np
import onnxruntime as ort
import tilefuse.ort
mode, model, bad, valid, reference = sys.argv[1:6]
if mode == "custom-ops":
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(__import__("pathlib").Path(model).parent / "libtilefuse_ops.so"))
else:
    so = tilefuse.ort.session_options(target="cuda" if mode == "cuda-ep" else "cpu")
sess = ort.InferenceSession(model, so)
out = {}
try:
    sess.run(None, dict(np.load(bad)))
    out["error"] = None
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
want = dict(np.load(reference))
got = sess.run(None, dict(np.load(valid)))
out["after"] = [float(np.abs(g - want[o.name]).max()) for g, o in zip(got, sess.get_outputs())]
print(json.dumps(out))
"""


def _run(mode: str, model: Path, bad: dict, valid: dict, tmp: Path, driver: Path | None = None) -> dict:
    import onnxruntime as ort

    ref = ort.InferenceSession(str(EXAMPLE), providers=["CPUExecutionProvider"])
    np.savez(tmp / "bad.npz", **bad)
    np.savez(tmp / "valid.npz", **valid)
    np.savez(tmp / "ref.npz", **dict(zip([o.name for o in ref.get_outputs()], ref.run(None, valid))))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if driver is not None:
        env["LD_LIBRARY_PATH"] = str(driver)
    done = subprocess.run([sys.executable, "-c", CHILD, mode, str(model), *(str(tmp / f) for f in ("bad.npz", "valid.npz", "ref.npz"))],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, f"the child died (rc {done.returncode}): {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def bert_exports(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bert-ort")
    out = {mode: export_ort(EXAMPLE, root / mode, "cpu", BERT_SHAPES, mode).model_path for mode in ("ep", "custom-ops")}
    out["cuda-ep"] = as_fake_cuda(root / "ep", root / "cuda-ep") / "model.onnx"
    return out


@pytest.mark.parametrize("mode", ["custom-ops", "ep", "cuda-ep"])
@pytest.mark.parametrize("bad", [1000, -101, 2**40, -2**63])
def test_an_out_of_range_id_fails_the_node_with_tilefuses_message(mode, bad, bert_exports, tmp_path, request):
    driver = request.getfixturevalue("fake_driver") if mode == "cuda-ep" else None
    rng = np.random.default_rng()
    valid = bert_feeds(rng, low=-100)  # negative ids count from the end, as onnxruntime's Gather does
    feeds = {k: v.copy() for k, v in valid.items()}
    feeds["input_ids"][rng.integers(2), rng.integers(16)] = bad
    result = _run(mode, bert_exports[mode], feeds, valid, tmp_path, driver)
    assert result["error"] is not None and result["error"].startswith("InvalidArgument: ")
    assert "tilefuse: node tilefuse_r0_0_reduce_sum_" in result["error"], result["error"]
    assert result["error"].endswith(f": {bert_message(bad)}"), result["error"]
    assert max(result["after"]) < 1e-4  # the next run, valid ids: plain onnxruntime's outputs


def test_the_descriptor_of_a_checking_kernel_lists_its_checks(bert_exports):
    descriptors = [p.read_text() for p in (bert_exports["custom-ops"].parent / "kernels").glob("*.tfk")]
    checking = [d for d in descriptors if "\nstatus " in d]
    assert len(checking) == 1
    assert "\nstatus 7 1 2\ncheck 100 input 'input_ids' (the indices of Gather node 'node_embedding')\n" in checking[0]


HARNESS_CHILD = r"""
import ctypes, json, sys
import numpy as np
from pathlib import Path
from tests.ort.gpu_harness import run_export

class HostMemory:  # cuda-bindings' part the harness uses, in host memory (the fake libcuda's "device")
    class CUresult:
        CUDA_SUCCESS = 0
    def __init__(self):
        self.blocks = []
    def cuMemAlloc(self, n):
        self.blocks.append(np.zeros(n, np.uint8))
        return 0, self.blocks[-1].ctypes.data
    def cuMemcpyHtoD(self, dst, src, n):
        ctypes.memmove(dst, src, n)
        return (0,)
    def cuMemcpyDtoH(self, dst, src, n):
        ctypes.memmove(dst, src, n)
        return (0,)
    def cuStreamSynchronize(self, stream):
        return (0,)

folder, bad, valid, reference = Path(sys.argv[1]), *sys.argv[2:5]
out = {}
try:
    run_export(HostMemory(), 7, folder, dict(np.load(bad)))  # 7: a stream, as onnxruntime's CUDA provider gives one
    out["error"] = None
except RuntimeError as e:
    out["error"] = str(e)
want = dict(np.load(reference))
got = run_export(HostMemory(), 7, folder, dict(np.load(valid)))
out["after"] = [float(np.abs(got[k] - want[k]).max()) for k in want]
print(json.dumps(out))
"""


def test_the_custom_ops_cuda_path_reads_the_status_word_back_on_the_stream(bert_exports, fake_driver, tmp_path):
    """FusedKernelCuda (the custom op on onnxruntime's CUDA provider), driven by the GPU
    harness with the stand-in driver: after the launch on the provider's stream the status
    word is read back (cuStreamSynchronize, cuMemcpyDtoH) and a bad id fails the node."""
    import onnx
    import onnxruntime as ort

    folder = as_fake_cuda(bert_exports["custom-ops"].parent, tmp_path / "ops-cuda")
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    for node in model.graph.node:
        if node.op_type == "FusedKernel":
            node.op_type = "FusedKernelCuda"
    onnx.save(model, str(folder / "model.onnx"))
    rng = np.random.default_rng()
    valid = bert_feeds(rng, low=-100)
    bad = {k: v.copy() for k, v in valid.items()}
    bad["input_ids"][0, rng.integers(16)] = 2**40
    ref = ort.InferenceSession(str(EXAMPLE), providers=["CPUExecutionProvider"])
    for name, feeds in (("bad", bad), ("valid", valid)):
        np.savez(tmp_path / f"{name}.npz", **feeds)
    np.savez(tmp_path / "ref.npz", **dict(zip([o.name for o in ref.get_outputs()], ref.run(None, valid))))
    env = dict(os.environ, PYTHONPATH=str(REPO), LD_LIBRARY_PATH=str(fake_driver))
    done = subprocess.run([sys.executable, "-c", HARNESS_CHILD, str(folder), *(str(tmp_path / f"{n}.npz") for n in ("bad", "valid", "ref"))],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["error"].startswith("tilefuse: node tilefuse_r0_0_reduce_sum_"), result["error"]
    assert result["error"].endswith(f": {bert_message(2**40)}")
    assert max(result["after"]) < 1e-4
