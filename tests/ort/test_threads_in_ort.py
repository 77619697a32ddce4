"""Inside onnxruntime a CPU kernel's parallel loops run on the session's intra-op pool
(issue 15): with intra_op_num_threads 1 or 2, through the custom-op library and the plugin
provider, the process has no tilefuse pool thread, the results match onnxruntime's own run of
the source model, and with 2 threads onnxruntime's worker does part of the kernels' work.
A kernel library built before the hook still runs there, on tilefuse's pool as before.

Each check runs in a fresh process: other tests' pools would be counted otherwise."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefuse.ort
from tilefuse.ort import MIN_EP_VERSION, _version, export_ort

N = 384  # a 384^3 MatMul is well above CpuOptions.parallel_min_work: its kernel has a parallel loop

CHILD = r"""
import json, os, sys, time
import numpy as np, onnxruntime as ort
source, folder, mode, threads, ep_library = sys.argv[1:]
def own_threads():
    out = {}
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/comm") as f:
            name = f.read().strip()
        with open(f"/proc/self/task/{task}/schedstat") as f:
            out[int(task)] = (name, int(f.read().split()[0]))  # ns on a CPU
    return out
so = ort.SessionOptions()
so.intra_op_num_threads = int(threads)
so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # idle workers block: their CPU time is work
if mode == "ep":
    ort.register_execution_provider_library("tilefuse", ep_library)
    so.add_provider_for_devices([d for d in ort.get_ep_devices() if d.ep_name == "TilefuseExecutionProvider"][:1], {})
else:
    so.register_custom_ops_library(folder + "/libtilefuse_ops.so")
# threads from before the session (numpy's BLAS, onnxruntime's own) run no kernel share:
# their CPU time is the machine's noise, not the kernels'
started = set(own_threads())
sess = ort.InferenceSession(folder + "/model.onnx", so)
ref_options = ort.SessionOptions()
ref_options.intra_op_num_threads = 1
ref = ort.InferenceSession(source, ref_options, providers=["CPUExecutionProvider"])
rng = np.random.default_rng()
worst, ran = 0.0, {}
for _ in range(20):
    x = rng.standard_normal((%(n)d, %(n)d)).astype(np.float32)
    before, main_before = own_threads(), time.thread_time_ns()
    got, = sess.run(None, {"x": x})
    main_ran, after = time.thread_time_ns() - main_before, own_threads()
    for t, (_, ns) in after.items():  # CPU time each thread spent in the exported model's run
        ran[t] = ran.get(t, 0) + ns - before.get(t, (None, 0))[1]
    # the running thread's own schedstat lags (it is brought up to date at the scheduler's
    # next tick or switch: it read 0 for a whole run once); its CPU clock does not
    ran[os.getpid()] += main_ran - (after[os.getpid()][1] - before[os.getpid()][1])
    want, = ref.run(None, {"x": x})
    worst = max(worst, float(np.abs(got - want).max() / max(1.0, np.abs(want).max())))
main = os.getpid()
time.sleep(0.05)  # a pool thread just started names itself
print(json.dumps({"names": sorted(name for name, _ in own_threads().values()), "worst": worst,
                  "main_ns": ran[main], "others_ns": sorted((v for t, v in ran.items() if t != main and t not in started),
                                                         reverse=True),
                  "before_session_ns": sorted((v for t, v in ran.items() if t != main and t in started), reverse=True)}))
""" % {"n": N}


def matmul_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((N, N)) / np.sqrt(N)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"], name="matmul"),
             helper.make_node("Relu", ["xw"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "matmul", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, N])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N, N])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("threads") / "matmul.onnx"
    onnx.save(matmul_model(), str(path))
    return path


@pytest.fixture(scope="module")
def exported(source, tmp_path_factory):
    """``exported(mode)``: the folder of the MatMul model's export (built once per mode)."""
    done: dict[str, Path] = {}

    def get(mode: str) -> Path:
        if mode == "ep" and _version(ort.__version__) < MIN_EP_VERSION:
            pytest.skip("plugin execution providers need onnxruntime >= 1.23")
        if mode not in done:
            out = tmp_path_factory.mktemp(f"threads-{mode}")
            export_ort(source, out, "cpu", None, mode)
            done[mode] = out
        return done[mode]

    return get


def _run(source: Path, folder: Path, mode: str, threads: int) -> dict:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")  # no BLAS thread to count (OMP_NUM_THREADS sizes the kernels: left as it is)
    done = subprocess.run([sys.executable, "-c", CHILD, str(source), str(folder), mode, str(threads),
                           tilefuse.ort.get_library_path()], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _kernels(folder: Path) -> list[Path]:
    return sorted((folder / "kernels").glob("*.so"))


def test_the_export_has_a_parallel_kernel_with_the_hook(exported):
    libs = _kernels(exported("custom-ops"))
    symbols = [subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True,
                              check=True).stdout for lib in libs]
    assert any("tf_threads_host" in s for s in symbols), "no kernel has a parallel loop: the model is too small"


@pytest.mark.parametrize("mode", ["custom-ops", "ep"])
@pytest.mark.parametrize("threads", [1, 2])
def test_kernels_run_on_the_sessions_intra_op_pool(mode, threads, source, exported):
    report = _run(source, exported(mode), mode, threads)
    assert "tilefuse-pool" not in report["names"]
    assert report["worst"] <= 1e-4
    if threads == 1:  # the calling thread did it all
        assert max(report["others_ns"], default=0) < 0.05 * report["main_ns"], report
    if threads == 2:
        # onnxruntime's one worker (blocking when idle) did a real part of the work:
        # the kernel's shares ran on two threads
        assert report["others_ns"] and report["others_ns"][0] > 0.1 * report["main_ns"], report


def _without_hook(folder: Path, out: Path) -> Path:
    """A copy of an export whose kernel libraries export no ``tf_threads_host``, as those
    built before it: the name is spelt otherwise in their symbol tables, and the
    descriptors' digests follow."""
    import hashlib
    import shutil

    shutil.copytree(folder, out)
    for lib in _kernels(out):
        data = lib.read_bytes()
        if b"tf_threads_host" not in data:
            continue
        lib.write_bytes(data.replace(b"tf_threads_host", b"tf_threads_hosX"))
        digest_old, digest_new = hashlib.sha256(data).hexdigest(), hashlib.sha256(lib.read_bytes()).hexdigest()
        for tfk in (out / "kernels").glob("*.tfk"):
            tfk.write_text(tfk.read_text().replace(digest_old, digest_new))
    return out


@pytest.mark.parametrize("mode", ["custom-ops", "ep"])
def test_a_kernel_without_the_hook_runs_on_tilefuses_pool(mode, source, exported, tmp_path):
    report = _run(source, _without_hook(exported(mode), tmp_path / "old"), mode, 1)
    assert report["worst"] <= 1e-4
    assert "tilefuse-pool" in report["names"]  # today's behaviour: its own threads, whatever onnxruntime says
