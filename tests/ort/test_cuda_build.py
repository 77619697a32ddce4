"""The CUDA side of the libraries, without a GPU: the driver API declarations match
cuda.h, the launcher and the CUDA execution provider compile against cuda.h's real types,
and a CUDA export writes EPContext nodes for TilefuseCudaExecutionProvider (or
FusedKernelCuda nodes for the custom-op library) with cubins and the launch each needs.
The custom ops need onnxruntime's CUDA provider (onnxruntime-gpu), which neither CI nor the
GPU machine has; the execution provider runs on any onnxruntime >= 1.23 with an NVIDIA GPU
(test_cuda_ep.py here, gpu_ep_check.py on the GPU machine)."""
import ctypes
import ctypes.util
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest

from tilefuse.cli.main import main
from tilefuse.ort import CUDA_EP_NAME, export_ort
from tilefuse.ort.build import CSRC

HERE = Path(__file__).resolve().parent
CUDA_INCLUDE = next((Path(p) for p in (os.environ.get("CUDA_HOME", "") + "/include", "/usr/local/cuda/include")
                     if (Path(p) / "cuda.h").is_file()), None)
EXAMPLE = HERE.parent.parent / "examples" / "bert-tiny.onnx"
needs_cuda_h = pytest.mark.skipif(CUDA_INCLUDE is None, reason="no cuda.h here")


def _cc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["cc", "-std=gnu11", "-Wall", "-Werror", f"-I{CSRC}", f"-I{CUDA_INCLUDE}", *args],
                          capture_output=True, text=True)


@needs_cuda_h
def test_driver_declarations_match_cuda_h(tmp_path):
    done = _cc("-fsyntax-only", str(HERE / "cuda_types_check.c"))
    assert done.returncode == 0, done.stderr
    exe = tmp_path / "check"
    done = _cc("-o", str(exe), str(HERE / "cuda_abi_check.c"))
    assert done.returncode == 0, done.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout


@needs_cuda_h
def test_launcher_compiles_against_cuda_h_types():
    sources = [str(CSRC / f) for f in ("tf_cuda.c", "tf_kernel.c", "tf_customops.c", "tf_ep.c", "tf_ep_cuda.c")]
    done = _cc("-fsyntax-only", "-Wextra", "-DTF_WITH_CUDA", "-DTF_CHECK_CUDA_H", *sources)
    assert done.returncode == 0, done.stderr


def test_cuda_export_for_the_execution_provider(tmp_path):
    """The default export (--as ep) for cuda: EPContext nodes that name the CUDA provider,
    each descriptor a cubin with its launch."""
    pytest.importorskip("tilelang")
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc here")
    result = export_ort(EXAMPLE, tmp_path, "cuda:sm_90a", {"batch": 1, "seq": 8})
    model = onnx.load(str(result.model_path), load_external_data=False)
    assert {n.op_type for n in model.graph.node} == {"EPContext"}
    for node in model.graph.node:
        attrs = {a.name: a for a in node.attribute}
        assert attrs["source"].s.decode() == CUDA_EP_NAME and attrs["embed_mode"].i == 0
        fields = {line.split()[0]: line.split()[1:] for line in (tmp_path / attrs["ep_cache_context"].s.decode())
                  .read_text().splitlines()}
        assert fields["target"] == ["cuda"] and fields["library"][0].endswith(".cubin") and "grid" in fields


@pytest.fixture(scope="module")
def cuda_export(tmp_path_factory):
    """bert-tiny exported for sm_90a through the CLI (the folder), or a skip."""
    pytest.importorskip("tilelang")
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc here")
    out = tmp_path_factory.mktemp("cuda") / "out"
    code = main(["export-ort", str(EXAMPLE), "-o", str(out), "--target", "cuda:sm_90a", "--as", "custom-ops",
                 "--shape", "batch=1", "--shape", "seq=8"])
    assert code == 0
    return out


def test_cuda_export_writes_cubins_and_launches(cuda_export):
    out = cuda_export
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    nodes = [n for n in model.graph.node if n.domain == "ai.tilefuse"]
    assert nodes and all(n.op_type == "FusedKernelCuda" for n in nodes)
    kinds = set()
    for node in nodes:
        descriptor = out / next(a.s.decode() for a in node.attribute if a.name == "kernel")
        lines = descriptor.read_text().splitlines()
        fields = {line.split()[0]: line.split()[1:] for line in lines}
        assert fields["target"] == ["cuda"]
        assert (descriptor.parent / fields["library"][0]).read_bytes()[:4] == b"\x7fELF"  # a cubin
        assert len(fields["grid"]) == len(fields["block"]) == 3 and "smem" in fields
        args = [line.split() for line in lines if line.startswith("arg ")]
        n_params = sum(line.startswith(("input ", "output ", "status ")) for line in lines)
        assert args and all(0 <= int(a[2]) < n_params for a in args)
        for a in args:
            kinds.add(a[1])
            if a[1] == "tensormap":
                rank = int(a[4])
                assert len(a) == 3 + 6 + 4 * rank - 1
    assert kinds <= {"pointer", "tensormap"}
    assert (out / "libtilefuse_ops.so").is_file()


class HostMemory:
    """Enough of cuda-bindings' driver for the harness to place tensors in host memory."""

    class CUresult:
        CUDA_SUCCESS = 0

    def __init__(self) -> None:
        self.blocks = []

    def cuMemAlloc(self, nbytes):
        self.blocks.append(np.zeros(nbytes, np.uint8))
        return 0, self.blocks[-1].ctypes.data

    def cuMemcpyHtoD(self, dst, src, nbytes):
        ctypes.memmove(dst, src, nbytes)
        return (0,)


def test_cuda_op_registers_loads_and_reports_a_missing_driver(cuda_export):
    """Without a GPU the CUDA op still registers for CUDAExecutionProvider, loads its
    descriptor and cubin, checks and binds its tensors, and then reports that there is no
    CUDA driver as an error status (through the harness's stand-in for onnxruntime)."""
    if ctypes.util.find_library("cuda"):
        pytest.skip("a CUDA driver is installed here: the GPU harness covers this machine")
    from tests.ort.gpu_harness import run_export

    feeds = {"input_ids": np.zeros((1, 8), np.int64), "attention_mask": np.ones((1, 8), np.int64)}
    with pytest.raises(RuntimeError, match=r"tilefuse: node tilefuse_r0_\S+: cannot open the CUDA driver \(libcuda.so.1\)"):
        run_export(HostMemory(), 0, cuda_export, feeds)
