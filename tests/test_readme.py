"""The README's op table is generated from the registry, never hand-kept."""
from pathlib import Path

import importlib.util

ROOT = Path(__file__).resolve().parent.parent


def test_readme_op_table_is_current():
    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "tools" / "update_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (ROOT / "README.md").read_text()
    assert module.BEGIN in text and module.END in text
    assert module.render(text) == text, "run: python tools/update_readme.py"


def test_readme_python_example_runs_as_written(tmp_path):
    """The Python API block runs unchanged from the repository root on the bundled model."""
    import re
    import shutil
    import subprocess
    import sys

    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Python API"):]
    section = section[:section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) >= 2  # the compile-and-run example and the onnxruntime drop-in
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT), "TILEFUSE_CACHE": str(tmp_path / "cache")}
    outputs = []
    for code in blocks:
        done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                              env=env)
        assert done.returncode == 0, code + done.stderr[-2000:]
        outputs.append(done.stdout)
    assert "[(2, 16, 64), (2, 64)]" in outputs[0]
    assert "(2, 64) main_graph" in outputs[1]
