"""A CUDA kernel's launch record, written into its .tfk descriptor by the exporter and
read back by the onnxruntime libraries' own C parser (tf_kernel_load, through the small
harness tfk_read.c): the C side sees exactly the record's grid, block, shared memory and
arguments, TMA descriptors included."""
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tilefuse.codegen.artifact import ParamSpec
from tilefuse.codegen.launch import CudaLaunch, KernelArg, TensorMap
from tilefuse.ort.build import CSRC
from tilefuse.ort.stitch import descriptor
from tilefuse.plan.model import IndexSite, Kernel

HERE = Path(__file__).resolve().parent
NAME = "gather_matmul_0123456789"
PARAMS = (ParamSpec("ids", "int64", (8,), "input"), ParamSpec("w", "float16", (4, 64, 128), "input"),
          ParamSpec("y", "float16", (8, 128), "output"), ParamSpec("status", "int64", (2,), "status"))
TMA = TensorMap(dtype=6, dims=(128, 64, 4), strides=(256, 16384), box=(64, 32, 1), element_strides=(1, 1, 1),
                interleave=0, swizzle=3, l2_promotion=2, oob_fill=0)
LAUNCH = CudaLaunch(f"{NAME}_kernel", (3, 2, 1), (384, 1, 1),
                    (KernelArg("ids", 0), KernelArg("w_desc", 1, TMA), KernelArg("y", 2), KernelArg("status", 3)),
                    dynamic_smem=99328, programmatic=True, arch="sm_90a")


@pytest.fixture(scope="module")
def tfk_read(tmp_path_factory) -> Path:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    exe = tmp_path_factory.mktemp("tfk") / "tfk_read"
    done = subprocess.run(["cc", "-std=gnu11", "-Wall", "-Werror", "-DTF_WITH_CUDA", f"-I{CSRC}", "-o", str(exe),
                           str(HERE / "tfk_read.c"), str(CSRC / "tf_kernel.c"), str(CSRC / "tf_sha256.c"), "-ldl", "-lpthread"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return exe


def test_the_c_parser_reads_the_launch_record_back(tmp_path, tfk_read):
    library = tmp_path / f"{NAME}.cubin"
    library.write_bytes(b"\x7fELF not really a cubin")  # the parser reads it and checks its sha256, nothing more
    kernel = Kernel(NAME, LAUNCH.entry, library, hashlib.sha256(library.read_bytes()).hexdigest(), LAUNCH, PARAMS)
    path = tmp_path / f"{NAME}.tfk"
    path.write_text(descriptor(kernel, NAME, (IndexSite("input 'ids'", 4),), cuda=True))
    done = subprocess.run([str(tfk_read), str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert (seen["symbol"], seen["inputs"], seen["outputs"], seen["checked"]) == (LAUNCH.entry, 2, 1, 1)
    assert (tuple(seen["grid"]), tuple(seen["block"]), seen["smem"]) == (LAUNCH.grid, LAUNCH.block, LAUNCH.dynamic_smem)
    want = [{"param": a.param, "tma": None if a.tma is None else {
        "dtype": a.tma.dtype, "interleave": a.tma.interleave, "swizzle": a.tma.swizzle,
        "l2_promotion": a.tma.l2_promotion, "oob_fill": a.tma.oob_fill, "dims": list(a.tma.dims),
        "strides": list(a.tma.strides), "box": list(a.tma.box), "element_strides": list(a.tma.element_strides)}}
        for a in LAUNCH.args]
    assert seen["args"] == want
