"""CPU kernels for a named instruction-set level (``--cpu-isa``, tilefuse/cpu_isa.py): the
plan records the extensions its kernels may use, a machine without one of them refuses to
load it with a clear error (instead of dying with SIGILL), and a level's build does not
depend on the machine it ran on."""
import dataclasses
import json
import platform
import subprocess
import sys

import numpy as np
import pytest

import models
from tilefuse.codegen.cpu.build import cache_key, find_compiler
from tilefuse.codegen.cpu.emit import emit_program
from tilefuse.compiler import compile
from tilefuse.cpu_isa import LEVELS, host_flags, host_level, requires
from tilefuse.errors import PlanError
from tilefuse.plan import load_plan
from tilefuse.runtime import InferenceSession
from tilefuse.target import CPU, adjust

X86 = platform.machine() in ("x86_64", "AMD64")
needs_x86 = pytest.mark.skipif(not X86 or "avx2" not in host_flags(), reason="needs an x86-64-v3 machine")


def _mlp(target, tmp_path, zoo_cache):
    shapes = models.ZOO["mlp"].shapes("tiny")
    path = models.build("mlp", "tiny", "float32", cache_dir=zoo_cache)
    return compile(path, target, shapes).save(tmp_path / "m.tfplan"), models.random_inputs(path, shapes, seed=3)


@needs_x86
def test_a_level_build_records_the_level_and_runs_like_native(tmp_path, zoo_cache):
    v3, feeds = _mlp(adjust(CPU, codegen__isa="x86-64-v3"), tmp_path / "v3", zoo_cache)
    native, _ = _mlp(CPU, tmp_path / "native", zoo_cache)
    manifest = json.loads((v3 / "manifest.json").read_text())
    assert manifest["cpu_requires"] == sorted(LEVELS["x86-64-v3"]) and manifest["target_spec"]["codegen"]["isa"] == "x86-64-v3"
    assert set(json.loads((native / "manifest.json").read_text())["cpu_requires"]) >= set(LEVELS["x86-64-v3"])
    a = InferenceSession(v3).run(None, feeds)
    b = InferenceSession(native).run(None, feeds)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


@needs_x86
def test_a_plan_for_extensions_this_machine_lacks_is_refused_before_a_kernel_loads(tmp_path, zoo_cache):
    saved, feeds = _mlp(adjust(CPU, codegen__isa="x86-64-v3"), tmp_path, zoo_cache)
    plan = dataclasses.replace(load_plan(saved), cpu_requires=(*LEVELS["x86-64-v3"], "avx512_imaginary"))
    with pytest.raises(PlanError, match=r"built for x86-64-v3 and may use avx512_imaginary, which this machine's CPU lacks"):
        InferenceSession(plan)
    # saved and loaded again: the manifest carries it, and the CLI says it in one line
    plan.save(tmp_path / "bad.tfplan")
    out = subprocess.run([sys.executable, "-m", "tilefuse", "run", str(tmp_path / "bad.tfplan"), "--random"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "avx512_imaginary" in out.stderr and "Traceback" not in out.stderr


def test_a_level_build_does_not_depend_on_the_machine(monkeypatch):
    from tilefuse.codegen.cpu import build

    src = emit_program(_program())
    compiler = find_compiler()
    before = {isa: cache_key(src, compiler, isa) for isa in ("native", "x86-64-v3")}
    monkeypatch.setattr(build, "_host", lambda: "x86_64;flags: other machine")
    assert cache_key(src, compiler, "x86-64-v3") == before["x86-64-v3"]
    assert cache_key(src, compiler, "native") != before["native"]


def test_unknown_levels_are_refused():
    with pytest.raises(ValueError, match="must be one of"):
        requires("x86-64-v9")
    if X86:
        assert host_level() in ("", *LEVELS)


def _program():
    from tests.plan.handmade import mlp_graph
    from tilefuse.partition import partition_graph
    from tilefuse.tile_ir import lower_group

    group = next(g for g in partition_graph(mlp_graph(8, 16, 32), CPU).groups if str(g.kind) != "opaque")
    return lower_group(group, CPU).program


@pytest.mark.parametrize("bad", ["avx2", [1], ["AVX 2"], ["x" * 41]])
def test_a_corrupt_extension_list_is_a_plan_error(tmp_path, zoo_cache, bad):
    from tilefuse.plan.files import write_manifest

    saved, _ = _mlp(CPU, tmp_path, zoo_cache)
    manifest = json.loads((saved / "manifest.json").read_text())
    manifest["cpu_requires"] = bad
    write_manifest(saved, manifest)  # (and its digest: the check behind it is what is tested)
    with pytest.raises(PlanError, match="cpu_requires"):
        load_plan(saved)


@needs_x86
def test_an_export_for_extensions_this_machine_lacks_is_refused_inside_onnxruntime(tmp_path, zoo_cache):
    """The onnxruntime libraries read the extensions a kernel may use from its descriptor
    and refuse the node where the CPU lacks one (fma4: AMD's, gone since Zen; absent on
    Intel too), with the error naming it, instead of dying with SIGILL."""
    import onnxruntime as ort

    from tilefuse.cpu_isa import host_flags
    from tilefuse.ort import export_ort

    if "fma4" in host_flags():
        pytest.skip("this CPU has FMA4")
    shapes = models.ZOO["mlp"].shapes("tiny")
    path = models.build("mlp", "tiny", "float32", cache_dir=zoo_cache)
    result = export_ort(path, tmp_path / "x", adjust(CPU, codegen__isa="x86-64-v3"), shapes, "custom-ops")
    descriptors = sorted((tmp_path / "x").rglob("*.tfk"))
    assert descriptors and all(f"requires {' '.join(sorted(LEVELS['x86-64-v3']))}" in d.read_text() for d in descriptors)
    feeds = models.random_inputs(path, shapes, seed=5)
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(result.library))  # the copy beside the model
    good = ort.InferenceSession(str(result.model_path), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(good, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    d = descriptors[0]
    d.write_text(d.read_text().replace("requires ", "requires fma4 "))
    with pytest.raises(Exception, match=r"built for CPU extensions this machine lacks \(fma4\)"):
        sess = ort.InferenceSession(str(result.model_path), so, providers=["CPUExecutionProvider"])
        sess.run(None, feeds)


@pytest.mark.parametrize("version, fused", [("gcc (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022 Free Software "
                                             "Foundation, Inc.", True),
                                            ("cc (GCC) 13.2.1 20231205 (Red Hat 13.2.1-6)", True),
                                            ("Debian clang version 14.0.6\nTarget: x86_64-pc-linux-gnu", False)])
def test_gcc_keeps_every_fma_chain_fused(version, fused):
    """GCC tuned for Zen splits a lone accumulator's fused multiply-add chain (tails then
    sum unlike strips, by host): its kernels take ``--param=avoid-fma-max-bits=0``; clang,
    which has no such param, does not get it."""
    from tilefuse.codegen.cpu.build import GCC_FLAGS, Compiler, flags

    got = flags("native", Compiler(("cc",), version))
    assert all(f in got for f in GCC_FLAGS) == fused, got
    assert "-march=native" in got and "-O3" in got
