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
