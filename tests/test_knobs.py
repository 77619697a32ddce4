"""Schedules are decided by data, not by module state (issue 16, item 4).

The stages that schedule and emit (partition/, tile_ir/, codegen/) hold no module-level
number or switch that a target could choose differently: those live in the target's device,
policies and codegen options, and a variant is built with ``tilefuse.target.adjust``. Two
checks: the scheduling stages define no such constants beyond the limits named below, and
nothing in the repository (package, tests, benchmarks, tools) assigns a number or switch to
an upper-case attribute of another module (``module.KNOB = x``, ``setattr``,
``monkeypatch.setattr``), which is how knobs used to be turned.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHEDULING = ("partition", "tile_ir", "codegen")
# module constants of the scheduling stages that are limits or facts of a format, not choices
LIMITS = {
    ("tile_ir/simplify.py", "INF"),  # the bound standing for "unbounded" in range analysis
    ("codegen/cuda/emit.py", "MAX_ELEMENTS"),  # TileLang indexes tensors with int32
    ("codegen/cpu/build.py", "COMPILE_TIMEOUT_S"),  # how long a C compiler may run
    ("codegen/cuda/build.py", "COMPILE_TIMEOUT_S"),  # how long nvcc may run
    ("codegen/toolchain.py", "ERROR_LINES"),  # compiler output kept in a CompileError
    ("codegen/toolchain.py", "STALE_TMP_S"),  # age of a killed build's temporary file
    ("codegen/launch.py", "MAX_THREADS"),  # CUDA's limits, which a launch record read from a plan is checked against
    ("codegen/launch.py", "MAX_SHARED_BYTES"),
    ("codegen/launch.py", "MAX_TMA_RANK"),
    ("tile_ir/passes/pipelines.py", "PRODUCER_THREADS"),  # the producer warpgroup TileLang adds (128 threads)
    ("tile_ir/lower/panels.py", "INT8_GROUP"),  # the four u8 x s8 products one 32-bit lane of a dot-product instruction sums (the int8 panel layout)
    ("tile_ir/ir.py", "WINOGRAD_TILE"),  # the output tile of the F(4 x 4, 3 x 3) matrices beside it
    ("codegen/cpu/block_epilogues.py", "BLOCK_COLUMNS"),  # the C product core's register block (prelude.py)
    ("codegen/cpu/block_epilogues.py", "STRIP_ROWS"),  # ... its AVX2 strips' tallest block (prelude.py, tf_strip_16)
    ("tile_ir/row_blocks.py", "BLOCK_ROWS"),  # ... its rows at most, which the row-block layout follows
}
SCALARS = (bool, int, float, type(None))


def _scalar(node: ast.AST) -> bool:
    """A literal number, switch or None, or arithmetic on literals."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, SCALARS)
    if isinstance(node, ast.UnaryOp):
        return _scalar(node.operand)
    if isinstance(node, ast.BinOp):
        return _scalar(node.left) and _scalar(node.right)
    return False


def test_scheduling_stages_hold_no_module_knobs():
    found = []
    for stage in SCHEDULING:
        for path in sorted((ROOT / "tilefuse" / stage).rglob("*.py")):
            rel = str(path.relative_to(ROOT / "tilefuse"))
            for node in ast.parse(path.read_text()).body:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) and node.value else []
                value = getattr(node, "value", None)
                for t in targets:
                    if isinstance(t, ast.Name) and t.id.isupper() and value is not None and _scalar(value) and (rel, t.id) not in LIMITS:
                        found.append(f"{rel}: {t.id} = {ast.unparse(value)}")
    assert not found, "schedule choices belong in the target's policies or options: " + "; ".join(found)


def _turned(tree: ast.AST) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for x in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if isinstance(x, ast.Attribute) and x.attr.isupper() and not (isinstance(x.value, ast.Name) and x.value.id in ("self", "cls")):
                        out.append(ast.unparse(x))
        elif isinstance(node, ast.Call):
            fn = ast.unparse(node.func)
            if fn.endswith("setattr") and len(node.args) >= 3:
                name, value = node.args[1], node.args[2]
                if isinstance(name, ast.Constant) and isinstance(name.value, str) and name.value.isupper() and _scalar(value):
                    out.append(f"{fn}(..., {name.value!r}, {ast.unparse(value)})")
    return out


def test_nothing_turns_a_module_knob():
    found = []
    for folder in ("tilefuse", "tests", "benchmarks", "tools", "models"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for what in _turned(ast.parse(path.read_text())):
                found.append(f"{path.relative_to(ROOT)}: {what}")
    assert not found, "build a target variant with tilefuse.target.adjust instead: " + "; ".join(found)


def test_the_checks_see_a_knob():
    """Both checks fire on what they look for (a check that cannot fail proves nothing)."""
    assert _turned(ast.parse("emit.MIN_BLOCKS_PER_SM = 2")) == ["emit.MIN_BLOCKS_PER_SM"]
    assert _turned(ast.parse("monkeypatch.setattr(rows, 'ROW_THREADS', 128)"))
    assert not _turned(ast.parse("monkeypatch.setattr(emit, 'PRELUDE', emit.PRELUDE + 'x')"))  # text, fault injection
    assert _scalar(ast.parse("1 << 20", mode="eval").body) and not _scalar(ast.parse("'x'", mode="eval").body)
