"""Private load directories (runtime/native.py): a process makes one, only where it needs
it, removes it at exit, and removes those of processes that ended without doing so."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.plan.handmade import mlp_graph

REPO = Path(__file__).resolve().parents[2]

LOAD_AND_RUN = """
import sys, numpy as np
from tilefuse.runtime import InferenceSession
s = InferenceSession(sys.argv[1])
feeds = {i.name: np.random.default_rng(0).standard_normal(i.shape).astype(np.float32) for i in s.get_inputs()}
out = s.run(None, feeds)
import glob, os
print(len(glob.glob(os.path.join(sys.argv[2], "tilefuse-load-%d-*" % os.getpid()))))
"""


def _dead_pid() -> int:
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except OSError:
            pass
        pid += 1


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory):
    from tilefuse.compiler import compile_graph
    from tilefuse.target import CPU

    return compile_graph(mlp_graph(8, 16, 32), CPU).plan.save(tmp_path_factory.mktemp("plan") / "mlp.tfplan")


def test_load_directories_are_made_where_needed_removed_at_exit_and_swept(tmp_path, plan_path):
    tmp, home = tmp_path / "tmp", tmp_path / "home"
    tmp.mkdir()
    cache = home / ".cache" / "tilefuse"
    cache.mkdir(parents=True)
    old = time.time() - 2 * 3600
    dead = _dead_pid()
    left = {
        "dead_old": tmp / f"tilefuse-load-{dead}-abc",  # swept
        "dead_old_cache": cache / f"tilefuse-load-{dead}-def",  # swept: every base is
        "dead_young": tmp / f"tilefuse-load-{dead}-ghi",  # kept: may be a process of another namespace, mid-load
        "alive_old": tmp / f"tilefuse-load-{os.getpid()}-jkl",  # kept: its process runs
        "other": tmp / "tilefuse-loader-1-x",  # kept: not a load directory
    }
    for name, d in left.items():
        d.mkdir()
        (d / "f").write_text("x")
        if name != "dead_young":
            os.utime(d, (old, old))
    env = dict(os.environ, TMPDIR=str(tmp), HOME=str(home), PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", LOAD_AND_RUN, str(plan_path), str(tmp)], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1"]  # its own, while it ran
    assert not left["dead_old"].exists() and not left["dead_old_cache"].exists()
    assert left["dead_young"].exists() and left["alive_old"].exists() and left["other"].exists()
    ours = [p.name for base in (tmp, cache) for p in base.iterdir() if p.name.startswith("tilefuse-load-")]
    assert sorted(ours) == sorted([left["dead_young"].name, left["alive_old"].name])  # its own went at exit; none in the cache
