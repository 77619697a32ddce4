"""CUDA code generation without a GPU: every tiny zoo model's kernels become TileLang
modules, lower for sm_90a on the host and compile to cubins with nvcc. Running them is
checked on the GPU machine (benchmarks/gpu_check.py); here the launch metadata and the
generated source are checked."""
import json
import re
import shutil

import pytest

import models
from tilefuse.codegen.cuda import build_all, emit_tilelang
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.target import CUDA_SM90A
from tilefuse.tile_ir.lower import lower_group

pytest.importorskip("tilelang")
if shutil.which("nvcc") is None:
    pytest.skip("nvcc is not on PATH", allow_module_level=True)

NAMES = [n for n, s in models.ZOO.items() if s.runs_in_ort]


def _programs(name, zoo_cache):
    graph = import_onnx(models.build(name, "tiny", "float32", cache_dir=zoo_cache), models.ZOO[name].shapes("tiny"))
    return [lower_group(g, CUDA_SM90A).program for g in partition_graph(graph, CUDA_SM90A).groups if str(g.kind) != "opaque"]


@pytest.mark.parametrize("name", NAMES)
def test_every_kernel_lowers_and_compiles_for_sm90a(name, zoo_cache):
    programs = _programs(name, zoo_cache)
    artifacts = build_all(programs, arch="sm_90a")
    assert len(artifacts) == len(programs)
    for program, art in zip(programs, artifacts):
        assert art.path.suffix == ".cubin" and art.path.read_bytes()[:4] == b"\x7fELF"
        launch = art.launch
        assert launch["entry"] == art.symbol
        assert all(g >= 1 for g in launch["grid"]) and 1 <= launch["block"][0] <= 1024
        assert launch["dynamic_smem"] <= 227 * 1024
        # every kernel argument points into one TileProgram param, each param is reached
        assert {a["param"] for a in launch["args"]} == set(range(len(program.params)))
        source = art.source.read_text()
        assert re.search(rf'extern "C" __global__ void (__launch_bounds__\([^)]*\) )?{art.symbol}\(', source)
        json.dumps(launch)  # plain data for the plan's manifest


def test_float32_products_stay_float32(zoo_cache):
    """No tensor cores (TF32) for float32 operands: products are exact FMA loops."""
    for program in _programs("mlp", zoo_cache):
        text = emit_tilelang(program).text
        assert "T.gemm(" not in text and "T.serial(" in text


def test_float16_products_use_tensor_cores(zoo_cache):
    graph = import_onnx(models.build("bert", "tiny", "float16", cache_dir=zoo_cache), models.ZOO["bert"].shapes("tiny"))
    texts = [emit_tilelang(lower_group(g, CUDA_SM90A).program).text for g in partition_graph(graph, CUDA_SM90A).groups]
    gemms = [t for t in texts if "T.gemm(" in t]
    # QKV, output projection and MLP chain of both layers (tiny attention tiles, 16x16, are
    # too small to split over 4 warps: those products are FMA loops)
    assert len(gemms) >= 6
    assert all("T.alloc_fragment" in t for t in gemms)


def test_emission_is_deterministic_and_names_the_kernel_by_content(zoo_cache):
    a = [emit_tilelang(p) for p in _programs("bert", zoo_cache)]
    b = [emit_tilelang(p) for p in _programs("bert", zoo_cache)]
    assert [x.text for x in a] == [x.text for x in b]
    # identical layers share one kernel: 2 layers, same kernels
    assert len({x.func for x in a}) < len(a)


def test_operand_tiles_load_through_t_copy_and_rows_reduce_across_threads(zoo_cache):
    """fp16 products: plain operand tiles become T.copy inside the pipelined K loop (cp.async
    on Hopper); a norm's row sums use several threads per row (partials in shared memory)."""
    graph = import_onnx(models.build("bert", "tiny", "float16", cache_dir=zoo_cache), models.ZOO["bert"].shapes("tiny"))
    texts = [emit_tilelang(lower_group(g, CUDA_SM90A).program).text for g in partition_graph(graph, CUDA_SM90A).groups]
    pipelined = [t.split("T.Pipelined(", 1)[1] for t in texts if "T.gemm(" in t and "T.Pipelined(" in t]
    assert pipelined and all(re.search(r"T\.copy\(in\d+\[", t) for t in pipelined)
    norms = [t for t in texts if "T.sqrt(" in t]
    assert norms and all(re.search(r"_part\d+ = T\.alloc_shared\(\(\d+, (2|4|8|16|32)\)", t) for t in norms)
