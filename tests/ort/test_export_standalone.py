"""An export runs on a server with onnxruntime and numpy only (issue 17, item 4): the folder
holds the library that runs its kernels, every file is readable by all, and a script that
cannot import tilefuse, with no C compiler on PATH and CC pointing nowhere, runs it through
onnxruntime's own API and matches onnxruntime on the source model."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

import models

SERVER = r"""
import sys, importlib.abc
class NoTilefuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "tilefuse" or name.startswith("tilefuse."):
            raise ImportError("tilefuse is not installed on this server")
sys.meta_path.insert(0, NoTilefuse())
import numpy as np, onnxruntime as ort
folder, mode, feeds_file, out_file = sys.argv[1:]
so = ort.SessionOptions()
if mode == "ep":
    ort.register_execution_provider_library("tilefuse", folder + "/libtilefuse_ep.so")
    so.add_provider_for_devices([d for d in ort.get_ep_devices() if d.ep_name == "TilefuseExecutionProvider"][:1], {})
else:
    so.register_custom_ops_library(folder + "/libtilefuse_ops.so")
sess = ort.InferenceSession(folder + "/model.onnx", so)
feeds = dict(np.load(feeds_file))
np.savez(out_file, *sess.run(None, feeds))
"""


@pytest.mark.parametrize("mode", ["ep", "custom-ops"])
def test_an_export_runs_with_onnxruntime_alone(mode, exports, tmp_path):
    if mode == "ep" and tuple(int(x) for x in ort.__version__.split(".")[:2]) < (1, 23):
        pytest.skip("plugin execution providers need onnxruntime >= 1.23")
    source, result = exports("bert", mode)
    folder = result.model_path.parent
    for path in folder.rglob("*"):
        if path.is_file():
            assert path.stat().st_mode & stat.S_IROTH, f"{path} is not readable by all"
    feeds = models.random_inputs(source, models.ZOO["bert"].shapes("tiny"), seed=5)
    np.savez(tmp_path / "feeds.npz", **feeds)
    env = {"PATH": str(tmp_path / "nothing"), "CC": str(tmp_path / "no-cc"), "HOME": str(tmp_path),
           "TILEFUSE_CACHE": str(tmp_path / "no-cache")}
    done = subprocess.run([sys.executable, "-I", "-c", SERVER, str(folder), mode, str(tmp_path / "feeds.npz"),
                           str(tmp_path / "out.npz")], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    got = np.load(tmp_path / "out.npz")
    want = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, feeds)
    for i, w in enumerate(want):
        np.testing.assert_allclose(got[f"arr_{i}"], w, rtol=1e-4, atol=1e-4)
    assert not (tmp_path / "no-cache").exists()  # nothing was built there
