"""The packages ``[tool.mypy]`` lists in pyproject.toml type-check clean (mypy is a dev
dependency: the README's test command installs it)."""
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_listed_packages_type_check():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    covered = {"tilefuse/*.py", "tilefuse/frontend", "tilefuse/ir", "tilefuse/partition", "tilefuse/patterns",
               "tilefuse/tile_ir", "tilefuse/plan", "tilefuse/backends", "tilefuse/reference", "tilefuse/conformance",
               "tilefuse/report", "tilefuse/cli"}
    assert covered <= set(config["files"])
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], capture_output=True, text=True,
                          cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout
