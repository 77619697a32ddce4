"""Shared fixtures: the model zoo cache (built on demand, kept between runs)."""
import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def zoo_cache() -> Path:
    """Where zoo models are built: $TILEFUSE_MODEL_CACHE, else ~/.cache/tilefuse/models."""
    path = Path(os.environ.get("TILEFUSE_MODEL_CACHE", Path.home() / ".cache" / "tilefuse" / "models"))
    path.mkdir(parents=True, exist_ok=True)
    return path
