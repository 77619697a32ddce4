"""Converters, one module per op family; importing this package registers them all."""
from tilefuse.frontend.converters import control, cumprod, elementwise, fold, grid_sample, losses, lrn, movement, nn, quantize, recurrent, reduce, rotary, swiglu  # noqa: F401
