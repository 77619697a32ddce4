"""The end-of-compile summary names each kernel by its pattern and the ONNX ops it covers,
and folds identical kernels (a transformer's repeated layers) into one row with a count."""
import re

import models
from tilefuse.compiler import compile_model
from tilefuse.partition.summary import format_summary, summarize_partition


def test_repeated_layers_fold_into_rows_named_by_pattern_and_ops(zoo_cache):
    shapes = models.ZOO["bert"].shapes("tiny")
    compiled = compile_model(models.build("bert", "tiny", "float32", cache_dir=zoo_cache), "cpu", shapes)
    s = summarize_partition(compiled.partition, compiled.onnx_nodes, compiled.onnx_ops)
    groups = s["groups"]
    assert {g["pattern"] for g in groups} >= {"gemm", "attention", "rows"}
    attention = [g for g in groups if g["pattern"] == "attention"]
    assert len(attention) == 2 and attention[0]["signature"] == attention[1]["signature"]  # two layers, one kernel
    assert "Softmax" in attention[0]["onnx_ops"] and "MatMul" in attention[0]["onnx_ops"]
    text = format_summary(s, top=20)
    assert "(identical kernels folded)" in text
    rows = [line for line in text.splitlines() if re.match(r"\s+\d+(,\d+)*\s+(gemm|attention|rows|windows|staged)\s", line)]
    counts = [int(line.split()[3]) for line in rows]
    assert sum(counts) == len(groups) - sum(g["anchor_kind"] == "opaque" for g in groups)  # every kernel, once
    assert 2 in counts and any("attention" in line and "Softmax" in line for line in rows)
