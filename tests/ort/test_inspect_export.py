"""`tilefuse inspect` on an export-ort model (issue 17, item 6): its tilefuse nodes are named
as kernels, not as unsupported ops, and it exits 0; an EPContext node of another provider is
still unsupported."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx
import pytest

REPO = Path(__file__).resolve().parents[2]


def _inspect(path):
    return subprocess.run([sys.executable, "-m", "tilefuse", "inspect", str(path)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


@pytest.mark.parametrize("mode, how", [("ep", "plugin execution provider, cpu"), ("custom-ops", "custom ops, cpu")])
def test_an_export_is_recognised(mode, how, exports):
    _, result = exports("mlp", mode)
    done = _inspect(result.model_path)
    assert done.returncode == 0, done.stderr
    assert f"a tilefuse export: {result.kernel_nodes} kernel node(s) ({how})" in done.stdout
    assert "unsupported ops: none" in done.stdout


def test_another_providers_context_node_is_still_unsupported(exports, tmp_path):
    _, result = exports("mlp", "ep")
    model = onnx.load(str(result.model_path), load_external_data=False)
    node = next(n for n in model.graph.node if n.op_type == "EPContext")
    for a in node.attribute:
        if a.name == "source":
            a.s = b"SomeOtherExecutionProvider"
    folder = Path(result.model_path).parent
    path = folder / "other.onnx"
    onnx.save(model, str(path))
    try:
        done = _inspect(path)
    finally:
        path.unlink()
    assert done.returncode == 2 and "EPContext" in done.stderr and node.name in done.stdout


@pytest.mark.parametrize("mode", ["ep", "custom-ops"])
def test_each_kernel_node_says_what_it_holds(mode, exports):
    """For Netron and people (issue 17, item 3): a tilefuse node's description names its
    kernel, pattern and the ONNX ops and nodes it computes, and its properties carry the
    same (kernel id, pattern, source nodes); onnxruntime still runs the model (the
    export tests above)."""
    _, result = exports("bert", mode)
    model = onnx.load(str(result.model_path), load_external_data=False)
    nodes = [n for n in model.graph.node if n.name.startswith("tilefuse_r")]
    assert nodes and len(nodes) == result.kernel_nodes
    for n in nodes:
        props = {p.key: p.value for p in n.metadata_props}
        assert n.doc_string.startswith(f"tilefuse kernel {props['tilefuse.kernel']} ({props['tilefuse.pattern']})")
        assert props["tilefuse.pattern"] in ("gemm", "attention", "rows", "windows", "staged")
        assert props["tilefuse.source_nodes"] and props["tilefuse.onnx_ops"]
    attention = [n for n in nodes if dict((p.key, p.value) for p in n.metadata_props)["tilefuse.pattern"] == "attention"]
    assert attention and all("Softmax" in n.doc_string for n in attention)
