"""Whether onnxruntime is an oracle for a quantized model's u8 x s8 products on this host.

With VNNI its kernels sum the products exactly; without it (AVX2) they add them in
int16 pairs that saturate (vpmaddubsw: 255 * 127 * 2 > 32767): a 64 x 3 x 40 product
over the full uint8 range had 97 of 2560 sums wrong, and bert-qdq's tiny output moved by
0.128 against the project's reference, where tilefuse's equals it (0.0). There the
tests compare quantized models with the reference (``tilefuse.reference``) instead."""
from __future__ import annotations

from tilefuse.cpu_isa import host_flags


def ort_int8_exact() -> bool:
    return bool({"avx512_vnni", "avx_vnni"} & host_flags())
