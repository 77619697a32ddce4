"""CUDA code generation without a GPU: every tiny zoo model's kernels become TileLang
modules, lower for sm_90a on the host and compile to cubins with nvcc. Running them is
checked on the GPU machine (benchmarks/gpu_check.py); here the launch metadata and the
generated source are checked."""
import json
import os
import re
import shutil
from pathlib import Path

import pytest

import models
from tilefuse.codegen.cuda import build_all, emit_tilelang
from tilefuse.codegen.launch import decode_cuda
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.plan.manifest import Decoder
from tilefuse.target import CUDA_SM90A
from tilefuse.tile_ir.lower import lower_group

pytest.importorskip("tilelang")
if shutil.which("nvcc") is None:
    pytest.skip("nvcc is not on PATH", allow_module_level=True)

NAMES = [n for n, s in models.ZOO.items() if s.runs_in_ort]


def _programs(name, zoo_cache):
    graph = import_onnx(models.build(name, "tiny", "float32", cache_dir=zoo_cache), models.ZOO[name].shapes("tiny"))
    return [lower_group(g, CUDA_SM90A).program for g in partition_graph(graph, CUDA_SM90A).groups if str(g.kind) != "opaque"]


def _reloaded(art):
    """The artifact's launch record through the manifest's JSON form and its checks."""
    data = json.loads(json.dumps(art.launch.encode()))
    return decode_cuda(Decoder({}, "manifest.json", Path(".")), data, "launch", len(art.params), art.symbol)


@pytest.mark.parametrize("name", NAMES)
def test_every_kernel_lowers_and_compiles_for_sm90a(name, zoo_cache):
    programs = _programs(name, zoo_cache)
    artifacts = build_all(programs, arch="sm_90a")
    assert len(artifacts) == len(programs)
    for program, art in zip(programs, artifacts):
        assert art.path.suffix == ".cubin" and art.path.read_bytes()[:4] == b"\x7fELF"
        launch = art.launch
        assert launch.entry == art.symbol and launch.arch == "sm_90a"
        assert all(g >= 1 for g in launch.grid) and 1 <= launch.block[0] <= 1024
        assert launch.dynamic_smem <= 227 * 1024
        # every kernel argument points into one TileProgram param (or the status word of a
        # kernel that checks indices, last), each one is reached
        assert {a.param for a in launch.args} == set(range(len(program.params) + (program.index_sites > 0)))
        source = art.source.read_text()
        assert re.search(rf'extern "C" __global__ void (__launch_bounds__\([^)]*\) )?{art.symbol}\(', source)
        assert launch.programmatic is False and "cudaGridDependencySynchronize" not in source
        assert _reloaded(art) == launch  # the manifest's form, and back


def _waits_before_touching_memory(source, symbol):
    """A kernel launched programmatically may start while the previous kernel still runs:
    it must release its dependents and then wait (griddepcontrol.wait) before it reads or
    writes any global buffer or issues a bulk copy. Only set-up may come first (shared
    memory carving, barrier init, tensor-map prefetch)."""
    head, body = re.split(rf"{symbol}\(([^)]*)\) {{\n", source, maxsplit=1)[-2:]
    pointers = re.findall(r"\*\s*(\w+)$", "\n".join(p.strip() for p in head.split(",")), flags=re.M)
    assert pointers or "CUtensorMap" in head
    before = body.split("cudaGridDependencySynchronize();", 1)
    assert len(before) == 2, f"{symbol} never waits for the previous kernel"
    assert "cudaTriggerProgrammaticLaunchCompletion();" in body
    assert before[0].count("{") == before[0].count("}"), f"{symbol} waits under a branch, not in every thread"
    touched = [p for p in pointers if re.search(rf"\b{p}\b", before[0])]
    assert not touched and not re.search(r"tma_load|tma_store|cp_async|cp\.async", before[0]), (symbol, touched)


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


def test_emission_does_not_depend_on_the_process_hash_seed(zoo_cache):
    """Kernel names are content hashes that a plan carries to other machines (the GPU
    checks re-lower there): two processes with different string hash seeds emit the same
    kernels for bert-base fp16 b32 (warp-row norms of several inputs, packed QKV, attention,
    producer-loaded products)."""
    import subprocess
    import sys

    script = (
        "import models\n"
        "from tilefuse.codegen.cuda import emit_tilelang\n"
        "from tilefuse.frontend import import_onnx\n"
        "from tilefuse.partition import partition_graph\n"
        "from tilefuse.target import CUDA_SM90A\n"
        "from tilefuse.tile_ir.lower import lower_group\n"
        f"g = import_onnx(models.build('bert', 'real', 'float16', cache_dir={str(zoo_cache)!r}), {{'batch': 32, 'seq': 128}})\n"
        "print(sorted({emit_tilelang(lower_group(x, CUDA_SM90A).program).func\n"
        "              for x in partition_graph(g, CUDA_SM90A).groups if str(x.kind) != 'opaque'}))\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=root,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")]
    assert runs[0] == runs[1] and runs[0].count("reduce_sum") >= 2


def test_operand_tiles_load_through_t_copy_and_rows_reduce_across_threads(zoo_cache):
    """fp16 products: plain operand tiles become T.copy inside the pipelined K loop (cp.async
    on Hopper); a norm's row sums use several threads per row: whole warps in a row-schedule
    kernel (test_cuda_warp_rows.py), partials in shared memory in a product's epilogue."""
    graph = import_onnx(models.build("bert", "tiny", "float16", cache_dir=zoo_cache), models.ZOO["bert"].shapes("tiny"))
    texts = [emit_tilelang(lower_group(g, CUDA_SM90A).program).text for g in partition_graph(graph, CUDA_SM90A).groups]
    pipelined = [t.split("T.Pipelined(", 1)[1] for t in texts if "T.gemm(" in t and "T.Pipelined(" in t]
    assert pipelined and all(re.search(r"T\.copy\(in\d+\[", t) for t in pipelined)
    norms = [t for t in texts if "T.sqrt(" in t]
    rows = [t for t in norms if "\nrows: " in t]
    epilogues = [t for t in norms if "\ngemm+epilogue: " in t]
    assert rows and all("T.warp_reduce_sum(" in t for t in rows)
    assert epilogues and all(re.search(r"_part\d+ = T\.alloc_shared\(\(\d+, (2|4|8|16|32)\)", t) for t in epilogues)


def _pool_programs():
    """ResNet-50's two pools in float16 at batch 32, each with a fused prologue and
    epilogue: ReLU, 3x3 stride-2 max pool, residual add; global average pool (sum, then
    times 1/49, in float32), cast, flatten, residual add."""
    import numpy as np

    from tilefuse.ir import Builder, DType, TensorType
    from tilefuse.ir.prims import ReduceFn, ScalarFn, WindowReduce

    b = Builder("pools")
    x = b.input("x", TensorType(DType.FLOAT16, (32, 64, 112, 112)))
    r = b.input("r", TensorType(DType.FLOAT16, (32, 64, 56, 56)))
    relu = b.map(ScalarFn.MAX, x, b.const(np.float16(0)))
    b.output("y", b.map(ScalarFn.ADD, b.emit1(WindowReduce(ReduceFn.MAX, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)), relu), r))
    f = b.input("f", TensorType(DType.FLOAT16, (32, 2048, 7, 7)))
    s = b.reduce(ReduceFn.SUM, b.cast(f, DType.FLOAT32), (2, 3), True)
    mean = b.cast(b.map(ScalarFn.MUL, s, b.const(np.float32(1 / 49))), DType.FLOAT16)
    g = b.input("g", TensorType(DType.FLOAT16, (32, 2048)))
    b.output("z", b.map(ScalarFn.ADD, b.reshape(mean, (32, 2048)), g))
    groups = partition_graph(b.graph, CUDA_SM90A).groups
    return [lower_group(grp, CUDA_SM90A).program for grp in groups]


def test_pooling_kernels_read_windows_in_place_for_sm90a():
    """Window-schedule kernels lower for sm_90a: one output per thread, the taps a serial
    loop around a register, the epilogue from that register, and no shared memory."""
    programs = _pool_programs()
    assert len(programs) == 2 and all(p.notes[0].startswith("window:") for p in programs)
    for program, art in zip(programs, build_all(programs, arch="sm_90a")):
        text = emit_tilelang(program).text
        assert re.search(r"for [^\n]* in T\.Parallel\([^\n]*\n\s+_acc_float32\[0\] = _c\d+\n\s+for \w+ in T\.serial\(", text)
        assert "T.alloc_local((1,)" in text
        launch = art.launch
        assert launch.dynamic_smem == 0 and launch.block[0] == program.threads
        source = art.source.read_text()
        assert "__shared__" not in source and "__syncthreads" not in source


def _product_graph(rows=512, k=256, n=256, siblings=1, transpose_last=False):
    """x[1, rows, k] @ W + bias per sibling; the last sibling optionally written transposed
    ([n, rows]: its contiguous axis runs along the product's rows, as K for attention)."""
    import numpy as np

    from tilefuse.ir import Builder, DType, TensorType
    from tilefuse.ir.prims import ScalarFn

    rng = np.random.default_rng(0)
    b = Builder("product")
    x = b.input("x", TensorType(DType.FLOAT16, (1, rows, k)))
    for i in range(siblings):
        w = b.const((rng.standard_normal((k, n)) * 0.02).astype(np.float16))
        y = b.map(ScalarFn.ADD, b.matmul(x, w), b.const((rng.standard_normal(n) * 0.02).astype(np.float16)))
        if transpose_last and i == siblings - 1:
            y = b.transpose(y, (0, 2, 1))
        b.output(f"y{i}", y)
    return b.graph


def _emitted(graph):
    (group,) = partition_graph(graph, CUDA_SM90A).groups
    return emit_tilelang(lower_group(group, CUDA_SM90A).program).text


def test_product_epilogues_compute_in_registers_and_store_through_a_shared_tile():
    """A plain product + bias: the epilogue reads the accumulator in registers (no fp32
    shared copy), writes a shared tile of the output's type and copies it out with T.copy;
    two blocks per SM; cp.async pipelines (TMA and warp specialisation off)."""
    text = _emitted(_product_graph())
    assert "c_tile_s" not in text
    rows, cols = map(int, re.search(r"_out0 = T\.alloc_shared\(\((\d+), (\d+)\), \"float16\"\)", text).groups())
    # rows padded by 16 bytes (bank conflicts); the tile's own columns copied out
    assert re.search(rf"T\.copy\(_out0\[0:{rows}, 0:{cols - 8}\], out0\[b0, .*\]\)", text)
    assert "T.annotate_min_blocks_per_sm(2)" in text
    assert "PASS_CONFIG = {'tl.disable_tma_lower': True, 'tl.disable_warp_specialized': True}" in text


def test_an_output_written_transposed_is_staged_from_registers_along_its_rows():
    """Sibling products (packed), one written transposed ([n, rows]: its contiguous axis
    runs along the tile's rows): no shared copy of the accumulator; each thread writes its
    own elements into a shared [col, row] tile of the output's type, which T.copy writes
    out along the rows. The other siblings stage [row, col] tiles the same way."""
    text = _emitted(_product_graph(siblings=3, transpose_last=True))
    assert "sibling products" in text and "c_tile_s" not in text
    (tile,) = re.findall(r"T\.copy\((_out\d)\[[^\]]+\], out2\[b0, [^\]]+\]\)", text)
    nests = re.findall(r"for (\w+), (\w+) in T\.Parallel\(\d+, \d+\):\n\s+(_out\d)\[(\w+), (\w+)\] = .*c_tile\[(\w+), (\w+)\]", text)
    (row, col, _, t0, t1, a0, a1), = [n for n in nests if n[2] == tile]
    assert (t0, t1) == (col, row) and (a0, a1) == (row, col)  # the loops in the accumulator's order


def test_the_lowering_reads_its_pass_options_from_the_module(tmp_path):
    """TileLang pass options travel in the kernel module (PASS_CONFIG), so they are part of
    the cache key; a module without them lowers with TMA off."""
    from tilefuse.codegen.cuda.tilelang_lower import DEFAULT_PASS_CONFIG, _load

    src = emit_tilelang(lower_group(partition_graph(_product_graph(), CUDA_SM90A).groups[0], CUDA_SM90A).program)
    path = tmp_path / f"{src.func}.py"
    path.write_text(src.text)
    _, config = _load(path, src.func)
    assert config == DEFAULT_PASS_CONFIG
    path.write_text(src.text.replace("PASS_CONFIG = ", "IGNORED = "))
    assert _load(path, src.func)[1] == DEFAULT_PASS_CONFIG


def test_packed_siblings_branch_per_sibling_and_store_heads_through_shared_tiles():
    """bert-base's QKV at batch 32 as one product of packed weights (64x128 tiles): one
    branch per sibling, each reading the accumulator in registers; Q and V leave through a
    shared [row, col] tile copied out one 64-wide head at a time (a 128-column tile spans
    two heads), K (written transposed) through a [col, row] tile, one [d, seq] piece per
    head. It lowers and compiles within the shared memory of three blocks per SM."""
    from tests.tile_ir.graphs import qkv_graph

    (group,) = partition_graph(qkv_graph(32, 128, 12, 64), CUDA_SM90A).groups
    program = lower_group(group, CUDA_SM90A).program
    src = emit_tilelang(program)
    text = src.text
    branches = re.findall(r"^        if \(\(bn // 6\) == (\d)\):$", text, re.M)
    assert sorted(branches) == ["0", "1", "2"]
    assert "c_tile_s" not in text  # every branch reads the accumulator in registers
    heads = re.findall(r"T\.copy\(_out\d\[0:64, (\d+):(\d+)\], (out\d)\[b0, [^\]]+, \(bm \* 64\):\(bm \* 64\) \+ 64, 0:64\]\)", text)
    assert sorted(h[:2] for h in heads) == [("0", "64"), ("0", "64"), ("64", "128"), ("64", "128")]
    k_heads = re.findall(r"T\.copy\(_out\d\[(\d+):(\d+), 0:64\], (out\d)\[b0, [^\]]+, 0:64, \(bm \* 64\):\(bm \* 64\) \+ 64\]\)", text)
    assert sorted(h[:2] for h in k_heads) == [("0", "64"), ("64", "128")]  # K: [d, seq] pieces
    assert len({h[2] for h in heads}) == 2 and {h[2] for h in k_heads}.isdisjoint(h[2] for h in heads)
    (art,) = build_all([program], arch="sm_90a")
    assert art.launch.dynamic_smem <= 76 * 1024  # three blocks per SM


def test_a_schedule_may_ask_for_its_blocks_per_sm(zoo_cache):
    """TileProgram.occupancy becomes the kernel's min-blocks-per-SM bound. Attention can ask
    for every tile resident in one wave (bert-base b32: 768 tiles, 6 a SM, K/V loads
    unpipelined); off by default, where it spilled and ran slower on the H200."""
    from tilefuse.target import adjust
    from tilefuse.tile_ir.ir import Loop

    graph = import_onnx(models.build("bert", "real", "float16", cache_dir=zoo_cache), {"batch": 32, "seq": 128})

    def flash(target):
        (group,) = [g for g in partition_graph(graph, target).groups
                    if lower_group(g, target).program.notes[0].startswith("flash attention")][:1]
        return lower_group(group, target).program

    default = flash(CUDA_SM90A)
    assert default.occupancy == 0 and "T.annotate_min_blocks_per_sm(2)" in emit_tilelang(default).text
    program = flash(adjust(CUDA_SM90A, attention__one_wave_occupancy=6))
    assert program.occupancy == 6 and "one wave" in program.notes[0]
    assert [s.stages for s in program.body if isinstance(s, Loop) and s.stages] == [1]
    assert "T.annotate_min_blocks_per_sm(6)" in emit_tilelang(program).text


def test_large_products_take_producer_tiles_loaded_by_tma():
    """bert-base b32's FFN-up shape (4096 x 768 @ 768 x 3072 + bias): 128x256 tiles whose
    operand loads a producer warp issues (TileLang's TMA + warp specialisation: no pass
    options turning them off), one block per SM, the staged output tile unpadded (one TMA
    box); it compiles with tensor-map arguments. The 768-wide projection (9 K steps a
    core) keeps the 64x128 cp.async tiles, as does the same product read through a cast
    (an operand converted on its way is no bulk copy)."""
    graph = _product_graph(rows=4096, k=768, n=3072)
    (group,) = partition_graph(graph, CUDA_SM90A).groups
    program = lower_group(group, CUDA_SM90A).program
    assert program.producer and "tiles 128x256x64" in program.notes[0] and "3-stage" in program.notes[0]
    src = emit_tilelang(program)
    assert "PASS_CONFIG = {}" in src.text and "annotate_min_blocks_per_sm" not in src.text
    assert re.search(r'_out0 = T\.alloc_shared\(\(128, 256\), "float16"\)', src.text)
    (art,) = build_all([program], arch="sm_90a")
    kinds = [a.kind for a in art.launch.args]
    assert kinds.count("tensormap") == 3 and art.launch.block[0] == 384  # A, B, output; producer + 2 warpgroups
    assert _reloaded(art) == art.launch
    small = lower_group(partition_graph(_product_graph(rows=4096, k=768, n=768), CUDA_SM90A).groups[0], CUDA_SM90A).program
    assert not small.producer and "tiles 64x128x64" in small.notes[0]
    # 2048^3: 128 tiles of 32 K steps, one a core (27.6 us on the H200 against 49.8 on cp.async tiles)
    square = lower_group(partition_graph(_product_graph(rows=2048, k=2048, n=2048), CUDA_SM90A).groups[0], CUDA_SM90A).program
    assert square.producer and "tiles 128x256x64" in square.notes[0]


@pytest.mark.parametrize("order", ["release-first", "wait-first"])
def test_programmatic_launch_waits_before_any_memory_access(order, zoo_cache):
    """With programmatic dependent launch on (a benchmark knob), every kernel, the
    producer-loaded one included (both warp roles), waits for the previous kernel before
    touching global memory, and its launch metadata says so."""
    from tilefuse.codegen.options import CudaOptions

    graph = import_onnx(models.build("bert", "tiny", "float16", cache_dir=zoo_cache), models.ZOO["bert"].shapes("tiny"))
    programs = [lower_group(g, CUDA_SM90A).program for g in partition_graph(graph, CUDA_SM90A).groups]
    producer = lower_group(partition_graph(_product_graph(rows=4096, k=768, n=3072), CUDA_SM90A).groups[0], CUDA_SM90A).program
    assert producer.producer
    for art in build_all([*programs, producer], arch="sm_90a", options=CudaOptions(programmatic_launch=order)):
        assert art.launch.programmatic is True
        _waits_before_touching_memory(art.source.read_text(), art.symbol)


def test_a_product_of_converted_operands_keeps_cp_async_tiles():
    """float32 activations under fp16 precision are rounded as they fill the tile: no
    producer, whatever the size."""
    import numpy as np

    from tilefuse.ir import Builder, DType, TensorType

    b = Builder("cast_product")
    x = b.input("x", TensorType(DType.FLOAT32, (1, 4096, 768)))
    w = b.const((np.random.default_rng(0).standard_normal((768, 3072)) * 0.02).astype(np.float16))
    b.output("y", b.matmul(b.cast(x, DType.FLOAT16), w))
    (group,) = partition_graph(b.graph, CUDA_SM90A).groups
    program = lower_group(group, CUDA_SM90A).program
    assert not program.producer and "producer" not in program.notes[0]


def test_attention_keeps_its_softmax_state_and_p_in_registers(zoo_cache):
    """bert-base b32 attention: the running max and sum and the rescale are register
    fragments, P (rounded to fp16) is the register A operand of P.V (wgmma from registers),
    the scores are overwritten by P in place; the online softmax needs few barriers."""
    graph = import_onnx(models.build("bert", "real", "float16", cache_dir=zoo_cache), {"batch": 32, "seq": 128})
    (group,) = [g for g in partition_graph(graph, CUDA_SM90A).groups
                if lower_group(g, CUDA_SM90A).program.notes[0].startswith("flash attention")][:1]
    program = lower_group(group, CUDA_SM90A).program
    assert "p_tile" not in {b.name for b in program.allocs}
    text = emit_tilelang(program).text
    for name in ("row_max", "row_sum", "rescale", "p_half"):
        assert re.search(rf"{name} = T\.alloc_fragment", text), name
    (art,) = build_all([program], arch="sm_90a")
    source = art.source.read_text()
    assert "wgmma_rs" in source and source.count("__syncthreads()") <= 8


def test_attention_over_a_prime_sequence_takes_whole_tiles_and_compiles():
    """ViT-base's attention (197 tokens, a prime; 12 heads of 64), fp16, batch 1: keys 64 a
    step with a partial last tile (scores past the sequence -inf) and power-of-two query
    tiles halved until the 12 heads fill the SMs (16 rows: 13 tiles a head), instead of
    1-row tiles of one key each; it lowers and compiles for sm_90a."""
    from tests.tile_ir.test_attention_tails import attention_model

    graph = import_onnx(attention_model(197, heads=12, d=64, dtype="float16"))
    (group,) = [g for g in partition_graph(graph, CUDA_SM90A).groups if str(g.kind) != "opaque"]
    program = lower_group(group, CUDA_SM90A).program
    assert "key tiles 64" in program.notes[0] and "last key tile 5" in program.notes[0], program.notes
    assert "query tiles 16" in program.notes[0] and program.grid == (1, 12, 13)
    (art,) = build_all([program], arch="sm_90a")
    assert "mma" in art.source.read_text() and art.launch.grid == (1, 12, 13)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_grouped_convolutions_lower_and_compile_as_tiled_products(dtype):
    """Grouped convolutions (ResNeXt's 32 groups of 4 channels, RegNet's 16 of 8 in and 16
    out, 4 of 4 in and 8 out, strided; a dilated 1-D one of 8 groups) are tiled implicit GEMMs of whole 128-thread blocks,
    no longer one thread of the staged schedule: TileLang lowers them and nvcc compiles them
    for sm_90a; in half floats the 16-column product runs on tensor cores."""
    import math

    import numpy as np

    from tests.compiler import grouped_convs

    names = ["g32_resnext", "g16_regnet", "g4_stride2_pads_asym", "g8_1d_dilated"]
    graph = import_onnx(grouped_convs.model(names, 0, np.dtype(dtype).type))
    programs = [lower_group(g, CUDA_SM90A).program for g in partition_graph(graph, CUDA_SM90A).groups]
    assert [p.schedule.groups for p in programs] == [32, 16, 4, 8] and all(p.threads == 128 for p in programs)
    artifacts = build_all(programs, arch="sm_90a")
    for program, art in zip(programs, artifacts):
        assert art.path.read_bytes()[:4] == b"\x7fELF" and art.launch.block[0] == 128
        assert math.prod(art.launch.grid) == math.prod(program.grid) >= program.schedule.groups, (art.launch, program.grid)
    regnet = artifacts[1].source.read_text()
    assert ("mma" in regnet) is (dtype == "float16")


@pytest.mark.parametrize("damage", ["cubin", "json", "cu"])
def test_a_damaged_cache_entry_is_built_again_not_used(tmp_path, monkeypatch, damage):
    """Each CUDA cache entry is checked against the sha256 beside it: a truncated cubin is
    compiled again by nvcc, damaged launch metadata or CUDA source lowered again."""
    from tilefuse.codegen.cuda import build as cuda_build
    from tilefuse.codegen.toolchain import entry_ok

    log = tmp_path / "nvcc.log"
    nvcc = tmp_path / "counting-nvcc"
    nvcc.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\nexec "{shutil.which("nvcc")}" "$@"\n')
    nvcc.chmod(0o755)
    monkeypatch.setenv("NVCC", str(nvcc))
    cuda_build.find_nvcc.cache_clear()
    lowerings = []
    real_lower = cuda_build.lower_module
    monkeypatch.setattr(cuda_build, "lower_module", lambda *a: lowerings.append(a) or real_lower(*a))
    program = lower_group(partition_graph(_product_graph(rows=64, k=64, n=64), CUDA_SM90A).groups[0], CUDA_SM90A).program
    try:
        (first,) = build_all([program], arch="sm_90a", cache_dir=tmp_path)
        compiles = lambda: sum("--cubin" in line for line in log.read_text().splitlines())
        assert (compiles(), len(lowerings)) == (1, 1)
        entry = first.path.with_suffix(f".{damage}")
        entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
        (again,) = build_all([program], arch="sm_90a", cache_dir=tmp_path)
        assert (compiles(), len(lowerings)) == ((2, 1) if damage == "cubin" else (1, 2))
        assert again.launch == first.launch and again.path == first.path
        assert all(entry_ok(first.path.with_suffix(s)) for s in (".cubin", ".json", ".cu"))
    finally:
        cuda_build.find_nvcc.cache_clear()  # the next test finds the real nvcc again
