"""What the zoo knows about one model: the record every builder module fills in.

Kept apart from ``registry`` so that builder modules can import it without importing
the registry that imports them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import onnx

Shape = tuple[int, ...]
Range = tuple[int, int]  # half-open [low, high)
V = TypeVar("V")
# (config, dtype) -> the finished model; the registry saves it
Builder = Callable[[str, str], onnx.ModelProto]

FAMILIES = ("transformer", "cnn", "mlp", "edge", "detector", "ocr", "speech", "embedding", "quantized")
DTYPES = ("float32", "float16")


class PerConfig(Mapping[str, Mapping[str, V]], Generic[V]):
    """config -> {tensor name: value}, read-only; calling it with a config returns a
    fresh dict the caller may edit, and {} for a config it does not list."""

    __slots__ = ("_table",)

    def __init__(self, table: Mapping[str, Mapping[str, V]] | None = None) -> None:
        self._table = {c: dict(v) for c, v in (table or {}).items()}

    def __call__(self, config: str) -> dict[str, V]:
        return dict(self._table.get(config, {}))

    def __getitem__(self, config: str) -> Mapping[str, V]:
        return self._table[config]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def __repr__(self) -> str:
        return f"PerConfig({self._table!r})"


@dataclass(frozen=True)
class ModelSpec:
    """One zoo entry.

    ``shapes(config)`` binds every input's dynamic dimensions to concrete values (batch 1
    for real configs; callers may override the batch). ``output_shapes(config)`` is what
    running the model at those shapes returns. ``input_ranges(config)`` gives the valid
    half-open ranges of integer inputs (token ids, indices); inputs named
    ``attention_mask`` get a padding mask instead. The three also index by config:
    ``spec.shapes["tiny"]``. Plain dicts given to the constructor are wrapped.

    The cache keys a built file on ``version``, the source text of the ``sources``
    modules and the library versions, so editing a builder rebuilds its models; bump
    ``version`` for a change the sources do not show; ``libraries`` names installed
    distributions beyond the usual exporters whose version shapes the file (a quantizer).
    ``dtypes``: the float types the model is built in (a quantized model has one).
    """

    name: str
    family: str
    configs: tuple[str, ...]
    shapes: PerConfig[Shape]
    output_shapes: PerConfig[Shape]
    builder: Builder = field(repr=False, compare=False)
    version: int = 1
    sources: tuple[str, ...] = ()
    runs_in_ort: bool = True
    input_ranges: PerConfig[Range] = field(default_factory=PerConfig)
    description: str = ""
    libraries: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = DTYPES

    def __post_init__(self) -> None:
        for name in ("shapes", "output_shapes", "input_ranges"):
            value = getattr(self, name)
            if not isinstance(value, PerConfig):
                object.__setattr__(self, name, PerConfig(value))
        if self.family not in FAMILIES:
            raise ValueError(f"{self.name}: family {self.family!r} not in {FAMILIES}")
        for config in self.configs:
            if config not in self.shapes or config not in self.output_shapes:
                raise ValueError(f"{self.name}: no shapes for config {config!r}")

    def check_config(self, config: str) -> None:
        if config not in self.configs:
            raise ValueError(f"{self.name} has configs {self.configs}, not {config!r}")

    def check_dtype(self, dtype: str) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} not in {DTYPES}")
        if dtype not in self.dtypes:
            raise ValueError(f"{self.name} is built in {', '.join(self.dtypes)} only, not {dtype}")


# Keys the zoo writes into each model's metadata_props, so a saved model carries what
# is needed to feed it (``inputs.random_inputs`` reads them back).
META_PREFIX = "tilefuse."
META_SHAPES = META_PREFIX + "input_shapes"      # json {input: [dims]} at the built config
META_RANGES = META_PREFIX + "input_ranges"      # json {input: [low, high)}
META_ERROR = META_PREFIX + "max_rel_error_vs_torch"


def set_metadata(model: onnx.ModelProto, values: Mapping[str, str]) -> None:
    """Add or replace ``values`` in ``model.metadata_props``, keeping the other entries."""
    merged = {p.key: p.value for p in model.metadata_props}
    merged.update(values)
    onnx.helper.set_model_props(model, merged)


def get_metadata(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}
