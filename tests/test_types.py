"""Every package is listed in ``[tool.mypy]`` (pyproject.toml) and type-checks clean (mypy
is a dev dependency: the README's test command installs it)."""
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_type_checks():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    # every package is listed: a new one type-checks from the start
    packages = {"tilefuse/*.py"} | {f"tilefuse/{p.parent.name}" for p in (ROOT / "tilefuse").glob("*/__init__.py")}
    assert packages <= set(config["files"]), sorted(packages - set(config["files"]))
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], capture_output=True, text=True,
                          cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout
