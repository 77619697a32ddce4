"""Fixtures for the onnxruntime integration tests: exports (built once per session), the
plugin provider's session options, the mixed model on disk, and a stand-in CUDA driver."""
from __future__ import annotations

import subprocess
from pathlib import Path

import onnx
import pytest

import models
from tests.ort.helpers import mixed_model
from tilefuse.ort import export_ort


@pytest.fixture(scope="session")
def fake_driver(tmp_path_factory) -> Path:
    """A folder holding the fake libcuda.so.1."""
    folder = tmp_path_factory.mktemp("fakecuda")
    done = subprocess.run(["cc", "-std=gnu11", "-O1", "-fPIC", "-shared", "-o", str(folder / "libcuda.so.1"),
                           str(Path(__file__).resolve().parent / "fake_libcuda.c"), "-ldl"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return folder


@pytest.fixture(scope="session")
def mixed_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mixed") / "mixed.onnx"
    onnx.save(mixed_model(), str(path))
    return path


@pytest.fixture(scope="session")
def exports(tmp_path_factory, zoo_cache):
    """``exports(name, mode)``: the export of tiny zoo model ``name`` (built once)."""
    done = {}

    def get(name: str, mode: str):
        if (name, mode) not in done:
            path = models.build(name, "tiny", "float32", cache_dir=zoo_cache)
            out = tmp_path_factory.mktemp(f"{name}-{mode}")
            done[name, mode] = (path, export_ort(path, out, "cpu", models.ZOO[name].shapes("tiny"), mode))
        return done[name, mode]

    return get


@pytest.fixture(scope="session")
def ep_options():
    """A function returning fresh SessionOptions with the tilefuse provider added; calling
    it skips the test on onnxruntime older than 1.23 (no plugin providers that compile)."""
    import onnxruntime as ort

    from tilefuse.ort import MIN_EP_VERSION, _version, session_options

    def options():
        if _version(ort.__version__) < MIN_EP_VERSION:
            pytest.skip(f"onnxruntime {ort.__version__} has no compiling plugin execution providers")
        return session_options()

    return options
