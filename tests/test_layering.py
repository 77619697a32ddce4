"""Imports flow one way through the stages (STYLE.md, practice 1).

onnx is imported only by the frontend, the conformance runner and the CLI; the IR and
the reference executor need neither onnx nor any later stage.
"""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "tilefuse"

# stage -> packages it must not import
FORBIDDEN = {
    "ir": {"onnx", "onnxruntime", "tilelang", "tilefuse.frontend", "tilefuse.reference", "tilefuse.partition",
           "tilefuse.patterns", "tilefuse.tile_ir", "tilefuse.codegen", "tilefuse.runtime", "tilefuse.cli", "tilefuse.conformance"},
    "reference": {"onnx", "onnxruntime", "tilelang", "tilefuse.frontend", "tilefuse.partition", "tilefuse.patterns",
                  "tilefuse.cli"},
    "partition": {"onnx", "onnxruntime", "tilelang", "tilefuse.frontend", "tilefuse.tile_ir", "tilefuse.codegen",
                  "tilefuse.runtime", "tilefuse.cli", "tilefuse.conformance", "tilefuse.report"},
    # patterns sit between the partitioner and the tile IR: they see the IR and the target,
    # nothing of how groups grow, nor of tiles, code or plans
    "patterns": {"onnx", "onnxruntime", "tilelang", "tilefuse.frontend", "tilefuse.reference", "tilefuse.partition",
                 "tilefuse.tile_ir", "tilefuse.codegen", "tilefuse.plan", "tilefuse.runtime", "tilefuse.cli",
                 "tilefuse.conformance", "tilefuse.report", "tilefuse.ort", "tilefuse.backends"},
    "tile_ir": {"onnx", "onnxruntime", "tilelang", "tilefuse.frontend", "tilefuse.codegen", "tilefuse.runtime",
                "tilefuse.plan", "tilefuse.cli", "tilefuse.conformance", "tilefuse.report"},
    "frontend": {"tilelang", "tilefuse.partition", "tilefuse.patterns", "tilefuse.tile_ir", "tilefuse.codegen", "tilefuse.runtime",
                 "tilefuse.cli", "tilefuse.conformance"},
    # codegen prints TilePrograms; it knows nothing of ONNX, fusion, plans or running them
    "codegen": {"onnx", "onnxruntime", "tilefuse.frontend", "tilefuse.partition", "tilefuse.patterns", "tilefuse.plan", "tilefuse.runtime",
                "tilefuse.cli", "tilefuse.conformance", "tilefuse.report", "tilefuse.ort", "tilefuse.reference"},
    # plan reads codegen's artifacts (tilefuse.codegen.artifact), never its generators' internals
    "plan": {"onnx", "onnxruntime", "tilelang", "tilefuse.frontend", "tilefuse.tile_ir", "tilefuse.runtime",
             "tilefuse.cli", "tilefuse.conformance", "tilefuse.report"},
    "runtime": {"onnx", "onnxruntime", "tilelang", "tilefuse.frontend", "tilefuse.partition", "tilefuse.patterns",
                "tilefuse.tile_ir",
                "tilefuse.codegen", "tilefuse.cli", "tilefuse.conformance", "tilefuse.report"},
    # ort sits on top of the compiler and the plan; only the CLI is above it
    "ort": {"tilelang", "tilefuse.cli", "tilefuse.conformance", "tilefuse.report", "tilefuse.runtime"},
}
# what a stage may import of a package it is otherwise kept from
ALLOWED = {
    # the launch records a plan's kernels carry (data only, codegen/launch.py): the CUDA
    # runtime launches each kernel from its CudaLaunch (runtime/cuda_launch.py)
    "runtime": {"tilefuse.codegen.launch"},
}
# The last stage: nothing but the CLI may import it.
ORT_IMPORTERS = {"ort", "cli"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_stages_import_only_downstream():
    problems = []
    for stage, forbidden in FORBIDDEN.items():
        for path in (PKG / stage).rglob("*.py"):
            for name in _imports(path) - ALLOWED.get(stage, set()):
                if any(name == f or name.startswith(f + ".") for f in forbidden):
                    problems.append(f"{path.relative_to(PKG)} imports {name}")
    assert not problems, problems


def test_lowerings_never_match():
    """Which kernel a group becomes is its pattern's match, made once: the lowerings take
    the match types from ``tilefuse.patterns`` and nothing that matches (only the
    dispatch's fall-through, in ``lower/__init__.py``, asks ``match_group`` again)."""
    allowed = {"AttentionMatch", "GemmMatch", "RowsMatch", "WindowsMatch", "ScatterMatch", "StagedMatch", "Softmax",
               "Epilogue", "STAGED", "Match", "product_extents"}
    problems = []
    for path in (PKG / "tile_ir").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tilefuse.patterns"):
                problems += [f"{path.relative_to(PKG)} imports {a.name}" for a in node.names if a.name not in allowed]
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tilefuse.partition") \
                    and node.module != "tilefuse.partition.model":
                problems.append(f"{path.relative_to(PKG)} imports {node.module}")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "patterns" \
                    and node.attr.startswith("match_") and path.relative_to(PKG).as_posix() != "tile_ir/lower/__init__.py":
                problems.append(f"{path.relative_to(PKG)} calls patterns.{node.attr}")
    assert not problems, problems


def test_only_the_cli_imports_the_ort_stage():
    problems = []
    for path in PKG.rglob("*.py"):
        if path.relative_to(PKG).parts[0] in ORT_IMPORTERS:
            continue
        for name in _imports(path):
            if name == "tilefuse.ort" or name.startswith("tilefuse.ort."):
                problems.append(f"{path.relative_to(PKG)} imports {name}")
    assert not problems, problems


def test_onnx_is_imported_only_at_the_edges():
    allowed = {"frontend", "conformance", "cli", "ort"}
    problems = []
    for path in PKG.rglob("*.py"):
        stage = path.relative_to(PKG).parts[0]
        if stage in allowed:
            continue
        for name in _imports(path):
            if name == "onnx" or name.startswith("onnx."):
                problems.append(f"{path.relative_to(PKG)} imports {name}")
    assert not problems, problems


def _load_time_imports(path: Path) -> set[str]:
    """What a module imports when it is imported: its top-level imports, less those only
    for type checkers (``if TYPE_CHECKING:``)."""
    names: set[str] = set()
    todo = list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue  # runs when called
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        todo.extend(ast.iter_child_nodes(node))
    return names


def test_backends_load_no_stage():
    """Every stage asks the backend registry (the tile IR's verifier too), so importing it
    must pull in no stage: a backend imports its generator, executor and launch records
    only when asked for one."""
    allowed = {"tilefuse.errors", "tilefuse.backends"}
    problems = []
    for path in (PKG / "backends").rglob("*.py"):
        for name in _load_time_imports(path):
            if name.startswith("tilefuse") and not any(name == a or name.startswith(a + ".") for a in allowed):
                problems.append(f"{path.relative_to(PKG)} imports {name}")
    assert not problems, problems


def test_the_compiler_and_runtime_load_no_gpu_stack():
    """The CPU path never needs TileLang, TVM, torch or cuda-python: importing the compiler,
    the registry and the runtime loads none of them."""
    import subprocess
    import sys

    code = ("import sys, tilefuse.compiler, tilefuse.backends, tilefuse.runtime; "
            "print(sorted(m for m in ('tilelang', 'tvm', 'torch', 'cuda', 'cuda.bindings') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=PKG.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
