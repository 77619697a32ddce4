"""`tilefuse --version` and `tilefuse cache [--clear]` (issue 17, item 6): the cache lists
what a compile put there, clearing it removes the kernels and onnxruntime libraries (the
zoo's models only with --models), and the next compile builds them again."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tilefuse

REPO = Path(__file__).resolve().parents[2]


def _tilefuse(*args, env):
    return subprocess.run([sys.executable, "-m", "tilefuse", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=600)


def test_version():
    done = _tilefuse("--version", env=dict(os.environ))
    assert done.returncode == 0 and done.stdout.strip() == f"tilefuse {tilefuse.__version__}"


def test_cache_lists_clears_and_is_rebuilt(tmp_path):
    env = dict(os.environ, TILEFUSE_CACHE=str(tmp_path / "cache"))
    (tmp_path / "cache" / "models").mkdir(parents=True)
    (tmp_path / "cache" / "models" / "m.onnx").write_bytes(b"x" * 10)
    plan = tmp_path / "p.tfplan"
    built = _tilefuse("optimize", REPO / "examples" / "bert-tiny.onnx", "--shape", "batch=2", "--shape", "seq=16",
                      "-o", plan, env=env)
    assert built.returncode == 0, built.stderr
    shown = _tilefuse("cache", env=env)
    assert shown.returncode == 0 and str(tmp_path / "cache") in shown.stdout
    cpu = next(line for line in shown.stdout.splitlines() if "cpu kernels" in line)
    assert int(cpu.split()[2]) > 0  # the plan's kernels, each with its source and digest
    cleared = _tilefuse("cache", "--clear", env=env)
    assert cleared.returncode == 0 and "removed cpu kernels" in cleared.stdout
    assert not (tmp_path / "cache" / "kernels").exists() and (tmp_path / "cache" / "models" / "m.onnx").exists()
    again = _tilefuse("run", plan, "--random", env=env)  # a saved plan needs no cache
    assert again.returncode == 0, again.stderr
    rebuilt = _tilefuse("optimize", REPO / "examples" / "bert-tiny.onnx", "--shape", "batch=2", "--shape", "seq=16",
                        "-o", tmp_path / "q.tfplan", env=env)
    assert rebuilt.returncode == 0 and any((tmp_path / "cache" / "kernels").glob("*.so"))
    wrong = _tilefuse("cache", "--models", env=env)
    assert wrong.returncode == 2 and wrong.stderr.strip() == "tilefuse: error: --models goes with --clear"
