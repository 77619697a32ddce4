"""What the CPU emitter writes: asserted on the generated C (no compiler needed)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.codegen.cpu_programs import elementwise, load, parallel, param, program
from tilefuse.codegen.cpu import emit_program
from tilefuse.codegen.toolchain import kernel_stem
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ScalarFn
from tilefuse.tile_ir.ir import Buffer, Call, Const, IOp, Load, Scope, Store, Var, iop

F32 = DType.FLOAT32


def _function(text: str) -> str:
    """The kernel function alone (the prelude of helpers precedes it)."""
    return text[text.index("\nvoid ") :]


def _axpy(m: int, n: int, name: str = "k0_axpy", dtype: DType = F32):
    x, y, out = param("x", dtype, (m, n)), param("y", dtype, (n,)), param("out", dtype, (m, n))
    body = [elementwise(out, lambda i: Call(ScalarFn.ADD, (Call(ScalarFn.MUL, (load(x, i), Const(2.0, dtype)), dtype),
                                                            load(y, (i[1],))), dtype))]
    return program(name, [x, y], [out], body, notes=("staged: 0 on-chip buffers, 0 bytes",))


def test_params_are_restrict_pointers_inputs_const():
    src = emit_program(_axpy(4, 8))
    fn = _function(src.text)
    assert f"void {src.symbol}(void **args)" in fn
    assert "const float *restrict x = (const float *)args[0];" in fn
    assert "const float *restrict y = (const float *)args[1];" in fn
    assert "float *restrict out = (float *)args[2];" in fn
    assert [p.role for p in src.params] == ["input", "input", "output"]
    assert src.params[0].shape == (4, 8) and src.params[0].dtype == "float32"


def test_big_parallel_nest_is_one_openmp_loop_small_one_is_not():
    big = _function(emit_program(_axpy(512, 1024)).text)
    assert "#pragma omp parallel for" in big
    assert big.index("#pragma omp parallel for") < big.index("for (int64_t i0 = 0; i0 < 512; ++i0)")
    assert "#pragma omp simd" in big  # the innermost loop is left to vectorise
    small = _function(emit_program(_axpy(4, 8)).text)
    assert "omp parallel" not in small
    assert "#pragma omp simd" in small


def test_loops_inside_a_parallel_grid_are_never_parallel_regions():
    x, out = param("x", F32, (8, 512, 512)), param("out", F32, (8, 512, 512))
    bx = Var("bx")
    body = [parallel((512, 512), lambda i: [Store(out, (bx, *i), load(x, (bx, *i)))])]
    fn = _function(emit_program(program("k1_grid", [x], [out], body, grid=(8,))).text)
    assert fn.count("#pragma omp parallel for") == 1
    assert "#pragma omp parallel for schedule(static)\n    for (int64_t bx = 0; bx < 8; ++bx)" in fn


def test_half_buffers_are_float16_storage_computed_in_float():
    fn = _function(emit_program(_axpy(4, 8, dtype=DType.FLOAT16)).text)
    assert "const _Float16 *restrict x = (const _Float16 *)args[0];" in fn
    assert "_Float16 *restrict out" in fn
    assert "tf_round_f16(" in fn  # each half op rounds once, as onnxruntime does
    bf = _function(emit_program(_axpy(4, 8, dtype=DType.BFLOAT16)).text)
    assert "const uint16_t *restrict x" in bf and "tf_bf16_to_f32(" in bf and "tf_f32_to_bf16(" in bf


def test_repeated_subexpression_is_computed_once():
    a, b, out = param("a", F32, (64,)), param("b", F32, (64,)), param("out", F32, (64,))

    def value(i):
        s = Call(ScalarFn.ADD, (load(a, i), load(b, i)), F32)
        s2 = Call(ScalarFn.ADD, (Load(a, i), Load(b, i)), F32)  # equal but a different object
        return Call(ScalarFn.MUL, (Call(ScalarFn.EXP, (s,), F32), Call(ScalarFn.EXP, (s2,), F32)), F32)

    fn = _function(emit_program(program("k2_cse", [a, b], [out], [elementwise(out, value)])).text)
    assert fn.count("a[i0]") == 1 and fn.count("tf_exp_f32(") == 1
    assert re.search(r"const float t\d+ = tf_exp_f32\(\(a\[i0\] \+ b\[i0\]\)\);", fn)


def test_loop_invariants_are_hoisted_but_guarded_loads_stay_guarded():
    x, y, out = param("x", F32, (16, 32)), param("y", F32, (16,)), param("out", F32, (16, 32))

    def value(i):
        row = Call(ScalarFn.EXP, (load(y, (i[0],)),), F32)  # invariant in i1
        guarded = Call(ScalarFn.LOG, (load(y, (iop(IOp.MUL, i[0], 1000),)),), F32)  # invariant, but under a WHERE
        pick = Call(ScalarFn.WHERE, (iop(IOp.LT, iop(IOp.ADD, i[0], i[1]), 1), guarded, Const(0.0, F32)), F32)
        return Call(ScalarFn.ADD, (Call(ScalarFn.MUL, (load(x, i), row), F32), pick), F32)

    fn = _function(emit_program(program("k3_hoist", [x, y], [out], [elementwise(out, value)])).text)
    inner = fn.index("for (int64_t i1 = 0")
    assert fn.index("tf_exp_f32(y[i0])") < inner  # hoisted out of the inner loop
    assert fn.index("logf(") > inner  # evaluated only where the WHERE takes it
    assert re.search(r"\? logf\(y\[\(i0 \* 1000\)\]\) : 0\.0f\)", fn)


def test_a_where_invariant_in_a_loop_is_hoisted_whole_with_its_guard():
    y, out = param("y", F32, (16,)), param("out", F32, (16, 32))
    pick = lambda i: Call(ScalarFn.WHERE, (iop(IOp.LT, i[0], 1), Call(ScalarFn.LOG, (load(y, (iop(IOp.MUL, i[0], 1000),)),), F32),
                                         Const(0.0, F32)), F32)  # noqa: E731
    fn = _function(emit_program(program("k3_hoist", [y], [out], [elementwise(out, pick)])).text)
    hoisted = r"const float t\d+ = \(\(i0 < 1\) \? logf\(y\[\(i0 \* 1000\)\]\) : 0\.0f\);"
    assert re.search(hoisted + r"\n *(#pragma omp simd\n *)?for \(int64_t i1", fn)


def test_tile_buffers_zeroed_on_stack_or_heap_and_freed():
    out = param("out", F32, (4,))
    small = Buffer("s0", F32, (16,), Scope.SHARED)
    big = Buffer("s1", F32, (64, 1024), Scope.FRAGMENT)  # 256 KB
    body = [Store(small, (Const(0, DType.INT64),), Const(1.0, F32)), Store(big, (Const(0, DType.INT64),) * 2, Const(1.0, F32)),
            elementwise(out, lambda i: Call(ScalarFn.ADD, (load(small, (Const(0, DType.INT64),)), load(big, (i[0], i[0]))), F32))]
    fn = _function(emit_program(program("k4_tiles", [], [out], body, allocs=[small, big])).text)
    assert "float s0[16] __attribute__((aligned(64))) = {0};" in fn
    assert "float *restrict s1 = (float *)tf_alloc(262144);" in fn
    assert fn.rstrip().endswith("free(s1);\n}")


def test_emission_is_deterministic_and_identical_layers_share_a_symbol():
    a, b = emit_program(_axpy(16, 16, "k3_axpy")), emit_program(_axpy(16, 16, "k3_axpy"))
    assert a.text == b.text and a.symbol == b.symbol
    assert re.fullmatch(r"axpy_[0-9a-f]{10}", a.symbol)
    other_layer = emit_program(_axpy(16, 16, "k9_axpy"))  # same content, another group of the model
    assert other_layer.symbol == a.symbol and other_layer.text == a.text
    assert emit_program(_axpy(16, 32, "k3_axpy")).symbol != a.symbol


def test_header_comment_carries_the_notes_and_params():
    text = emit_program(_axpy(4, 8)).text
    header = text[: text.index("*/")]
    assert "tilefuse cpu kernel: axpy" in header
    assert "staged: 0 on-chip buffers, 0 bytes" in header
    assert "out args[2] out: float32[4, 8]" in header


def test_kernel_stem_is_a_c_identifier_without_the_group_index():
    assert kernel_stem("k12_matmul_reduce_sum") == "matmul_reduce_sum"
    assert kernel_stem("weird name/with.dots") == "weird_name_with_dots"
    assert kernel_stem("0start") == "k_0start"


def test_symbol_does_not_depend_on_the_process(tmp_path):
    """Same program in fresh interpreters with different hash seeds: same symbol and text."""
    script = (
        "import sys\n"
        "from tests.codegen.test_cpu_source import _axpy\n"
        "from tilefuse.codegen.cpu import emit_program\n"
        "from tilefuse.ir.dtypes import DType\n"
        "s = emit_program(_axpy(512, 1024, 'k7_axpy', dtype=DType.FLOAT16))\n"
        "open(sys.argv[1], 'w').write(s.symbol + '\\n' + s.text)\n"
    )
    texts = []
    for seed in ("1", "2"):
        out = tmp_path / f"{seed}.c"
        subprocess.run([sys.executable, "-c", script, str(out)], check=True, cwd=Path(__file__).resolve().parents[2],
                       env={**os.environ, "PYTHONHASHSEED": seed})
        texts.append(out.read_text())
    assert texts[0] == texts[1]
