"""tilefuse's model zoo: seeded, deterministic ONNX models that look like real exports.

    from models import ZOO, build, random_inputs
    path = build("bert", "tiny", "float32")        # cached under $TILEFUSE_MODEL_CACHE
    feeds = random_inputs(path, ZOO["bert"].shapes("tiny"), seed=0)

Families: transformers from ``transformers`` with random weights (each also as a
``-legacy`` variant in the older opset-14 style), plain-torch CNNs (ResNet, MobileNetV2,
U-Net, ConvNeXt, EfficientNet) and an MLP, a YOLOv8-style detector, a CRNN text
recogniser, Whisper's audio encoder, a sentence-embedding BERT, and hand-built ``edge-*``
graphs. ``python -m models list`` shows them all. Building needs
torch and transformers (imported only when a model is actually built); reading a cached
model, the specs and ``random_inputs`` need only onnx and numpy.
"""

from .inputs import random_inputs
from .registry import ZOO, build, default_cache_dir, get_spec, model_path
from .spec import DTYPES, FAMILIES, ModelSpec

__all__ = ["DTYPES", "FAMILIES", "ZOO", "ModelSpec", "build", "default_cache_dir", "get_spec",
           "model_path", "random_inputs"]
