"""Row reductions on CUDA as whole warps per row (codegen/cuda/warp_rows.py): norms and
softmax rows fold in registers and shuffles, with no tile and no partials in shared memory;
programs of another shape keep the generic emission. Lowered with TileLang and compiled for
sm_90a here; their numbers are checked on the GPU machine."""
import dataclasses
import re
import shutil

import pytest

import models
from tilefuse.codegen.cuda import build_all, emit_tilelang
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.target import CUDA_SM90A
from tilefuse.errors import GraphError
from tilefuse.tile_ir import verify_program
from tilefuse.tile_ir.lower import lower_group
from tilefuse.tile_ir.passes import for_device

pytest.importorskip("tilelang")
if shutil.which("nvcc") is None:
    pytest.skip("nvcc is not on PATH", allow_module_level=True)


def _row_programs(model, shapes):
    """The row-schedule programs with reductions, one per distinct kernel."""
    graph = import_onnx(model, shapes)
    out, seen = [], set()
    for g in partition_graph(graph, CUDA_SM90A).groups:
        if str(g.kind) == "opaque":
            continue
        p = lower_group(g, CUDA_SM90A).program
        if p.notes[0].startswith("rows: ") and "row reduction" in p.notes[0] and emit_tilelang(p).func not in seen:
            seen.add(emit_tilelang(p).func)
            out.append(p)
    return out


def _softmax(rows, e, dtype="float32"):
    import onnx
    from onnx import TensorProto, helper

    elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[dtype]
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "softmax",
                              [helper.make_tensor_value_info("x", elem, [rows, e])],
                              [helper.make_tensor_value_info("y", elem, [rows, e])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _assert_warp_rows(text, lanes, reductions):
    """Whole warps per row: lanes read neighbouring elements, the row folds in registers and
    warp shuffles; no (br, E) tile, no shared partials, no serial fold of them."""
    assert "T.get_thread_binding()" in text and f"_lane = _tx % {lanes}" in text
    assert sum(text.count(f"T.warp_reduce_{fn}(") for fn in ("sum", "max", "min")) == reductions
    # j = jj * L + lane, or (jj * L + lane) * V + v with runs of V read as one vector: coalesced
    assert re.search(rf"= (_t\d+ \* {lanes} \+ _lane|\(_t\d+ \* {lanes} \+ _lane\) \* \d+ \+ _t\d+)\n", text)
    assert "x_tile" not in text and "_part" not in text and "T.Parallel(" not in text
    if lanes == 32:
        assert "T.alloc_shared" not in text and "T.sync_threads()" not in text
    else:  # the row's warps meet in a (rows, warps) array, one per reduction
        assert len(re.findall(rf"_warps\d+ = T\.alloc_shared\(\(\d+, {lanes // 32}\), \"float(32|64)\"\)", text)) == reductions
        assert text.count("T.sync_threads()") == reductions


def _compile(programs):
    arts = build_all(programs, arch="sm_90a")
    for p, art in zip(programs, arts):
        assert art.path.read_bytes()[:4] == b"\x7fELF"
        assert art.launch.block[0] == p.threads and art.launch.grid[0] == p.grid[0]
        assert "tl::warp_reduce_" in art.source.read_text()
    return arts


@pytest.mark.parametrize("batch, rows_per_tile, lanes", [(32, 8, 32), (1, 1, 256)])
def test_bert_layer_norms_are_whole_warps_per_row(batch, rows_per_tile, lanes, zoo_cache):
    """bert-base fp16 LayerNorms (the embedding one with its gathers, and the layers'):
    batch 32 (4096 rows) takes a warp per row, 8 rows a block; batch 1 (128 rows, fewer than
    the SMs) one row a block, its 8 warps meeting in shared memory."""
    model = models.build("bert", "real", "float16", cache_dir=zoo_cache)
    programs = _row_programs(model, {"batch": batch, "seq": 128})
    assert len(programs) == 2
    for p in programs:
        assert f"tiles of {rows_per_tile} rows x 768" in p.notes[0]
        _assert_warp_rows(emit_tilelang(p).text, lanes, 2)
    for p, art in zip(programs, _compile(programs)):
        source = art.source.read_text()
        if lanes == 32:  # nothing shared: no barrier at all; runs of 8 fp16 read as one 16-byte load
            assert art.launch.dynamic_smem == 0 and "__syncthreads" not in source
            assert "*(uint4*)(in0" in source
        if lanes == 32 and len(p.params) == 4:  # the layers' norm: its input read once, kept in registers
            text = emit_tilelang(p).text
            assert len(re.findall(r"\bin0\[", text)) == 1 and "_row_in0 = T.alloc_local((24,), \"float16\")" in text
            assert source.count("*(uint4*)(in0") == 1
            # 512 tiles of 8 rows: all resident at once, 4 a core (registers kept to 64)
            assert "T.annotate_min_blocks_per_sm(4)" in text and "4 tiles resident per core" in p.notes[0]
        if lanes != 32:
            assert 0 < art.launch.dynamic_smem <= 1024


def test_llama_rms_norm_is_whole_warps_per_row(zoo_cache):
    """LLaMA tiny's RMSNorm (rows of 64, 32 rows): 4 rows a block, two warps a row."""
    programs = _row_programs(models.build("llama", "tiny", "float32", cache_dir=zoo_cache),
                             models.ZOO["llama"].shapes("tiny"))
    assert programs
    for p in programs:
        _assert_warp_rows(emit_tilelang(p).text, 64, 1)
    _compile(programs)


@pytest.mark.parametrize("rows, e, dtype, lanes", [(4096, 128, "float16", 32), (64, 128, "float32", 128)])
def test_softmax_rows_are_whole_warps_per_row(rows, e, dtype, lanes):
    """Softmax over rows: the max, then the sum of exponentials, each a warp reduction."""
    (p,) = _row_programs(_softmax(rows, e, dtype), {})
    text = emit_tilelang(p).text
    _assert_warp_rows(text, lanes, 2)
    assert "T.warp_reduce_max(" in text and 'float("-inf")' in text
    _compile([p])


def test_rows_without_whole_warps_keep_the_generic_emission():
    """Rows of 100 (no whole warps divide them) and a block too small for a warp per row
    keep today's form: a (rows, E) tile reduced by TileLang or by partials in shared memory."""
    (p,) = _row_programs(_softmax(64, 100), {})
    text = emit_tilelang(p).text
    assert "T.get_thread_binding" not in text and "_part0 = T.alloc_shared" in text
    (p,) = _row_programs(_softmax(4096, 128, "float16"), {})
    assert "tiles of 8 rows" in p.notes[0]
    narrow = for_device(dataclasses.replace(p, threads=128), CUDA_SM90A.device)  # 16 lanes a row
    assert narrow.row_lanes == 0
    text = emit_tilelang(narrow).text
    assert "T.get_thread_binding" not in text and "x_tile0 = T.alloc_fragment((8, 128)" in text
    (art,) = build_all([narrow], arch="sm_90a")
    assert art.path.read_bytes()[:4] == b"\x7fELF"


def test_per_row_outputs_are_written_by_lane_zero():
    """A row max that is an output itself ([rows, 1], float64), beside exp(x - max), and a
    row min alone: lane 0 of each row stores the per-row value; max and min start from
    -inf and inf."""
    from tilefuse.ir import Builder, DType, TensorType
    from tilefuse.ir.prims import ReduceFn, ScalarFn

    b = Builder("row_extremes")
    x = b.input("x", TensorType(DType.FLOAT64, (1024, 256)))
    m = b.reduce(ReduceFn.MAX, x, (1,), True)
    b.output("y", b.map(ScalarFn.EXP, b.map(ScalarFn.SUB, x, m)))
    b.output("m", m)
    b.output("n", b.reduce(ReduceFn.MIN, x, (1,), True))
    programs = [lower_group(g, CUDA_SM90A).program for g in partition_graph(b.graph, CUDA_SM90A).groups]
    assert len(programs) == 2
    for p, fn, inf in zip(programs, ("max", "min"), ('float("-inf")', 'float("inf")')):
        text = emit_tilelang(p).text
        _assert_warp_rows(text, 64, 1)
        assert f"T.warp_reduce_{fn}(" in text and inf in text
        assert re.search(r"if _lane == 0:\n\s+i\d+ = 0\n\s+out0\[", text)
    _compile(programs)


def test_a_tile_read_outside_its_reduction_keeps_the_generic_emission():
    """The warp form holds no tile: a nest that reads one (here after its reduction) or reads
    a row buffer at another row sends the program to the generic emission."""
    from tilefuse.tile_ir.ir import IOp, Load, Loop, LoopKind, Store, Var, iop

    (p,) = _row_programs(_softmax(4096, 128, "float16"), {})
    tile, row, out = p.allocs[2], p.allocs[0], p.outputs[0]
    assert tile.name == "x_tile0" and row.name == "row0"
    i, j = Var("ti"), Var("tj")

    def nest(value):
        at = (iop(IOp.ADD, iop(IOp.MUL, p.block_vars[0], 8), i), j)
        return Loop(i, 8, LoopKind.PARALLEL, (Loop(j, 128, LoopKind.PARALLEL, (Store(out, at, value),)),))

    assert p.row_lanes == 32 and "T.get_thread_binding" in emit_tilelang(p).text
    for value in (Load(tile, (i, j)), Load(row, (iop(IOp.SUB, 7, i),))):
        changed = dataclasses.replace(p, body=p.body + (nest(value),))
        with pytest.raises(GraphError, match="no row program"):  # the decision no longer holds
            verify_program(changed, CUDA_SM90A)
        changed = for_device(changed, CUDA_SM90A.device)
        assert changed.row_lanes == 0 and "T.get_thread_binding" not in emit_tilelang(changed).text


def test_loads_under_a_where_branch_are_not_read_ahead():
    """Only loads evaluated whatever a WHERE decides may be read into registers before the
    steps: a branch's loads may be out of range where it is not taken."""
    from tilefuse.codegen.cuda.warp_rows import _unconditional
    from tilefuse.ir import DType
    from tilefuse.ir.prims import ScalarFn
    from tilefuse.tile_ir.ir import Buffer, Call, Load, Scope, Var

    x, y, m = (Buffer(n, DType.FLOAT32, (8, 64), Scope.GLOBAL) for n in ("x", "y", "m"))
    i, j = Var("i"), Var("j")
    cond, a, b = Load(m, (i, j)), Load(x, (i, j)), Load(y, (i, j))
    e = Call(ScalarFn.ADD, (Call(ScalarFn.WHERE, (cond, a, b), DType.FLOAT32), a), DType.FLOAT32)
    seen = [z for z in _unconditional(e) if isinstance(z, Load)]
    assert cond in seen and a in seen and b not in seen  # a also read outside the branch
