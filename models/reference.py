"""Reference runs that travel: fresh random inputs and onnxruntime's CPU outputs for them
in one .npz (keys ``in:NAME`` and ``out:NAME``), so a GPU machine can check a plan without
the zoo's builders. Extra arrays (a tolerance, say) may ride along under other keys."""
from __future__ import annotations

import random
from pathlib import Path
from typing import Mapping

import numpy as np

from .inputs import random_inputs


def save_reference(path: str | Path, shapes: Mapping, out: str | Path, **extra: np.ndarray) -> None:
    """Inputs drawn with a fresh seed and onnxruntime's outputs for ``path`` at ``shapes``."""
    import onnxruntime as ort

    feeds = random_inputs(path, shapes, seed=random.randrange(2**31))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    np.savez(out, **{f"in:{k}": v for k, v in feeds.items()},
             **{f"out:{k}": v for k, v in zip(names, sess.run(names, feeds))}, **extra)


def load_reference(npz) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(feeds, expected outputs) from a file save_reference wrote (or its loaded NpzFile)."""
    data = np.load(npz) if isinstance(npz, (str, Path)) else npz
    feeds = {k[3:]: data[k] for k in data.files if k.startswith("in:")}
    expected = {k[4:]: data[k] for k in data.files if k.startswith("out:")}
    return feeds, expected
