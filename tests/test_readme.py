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
