"""Converters, one module per op family; importing this package registers them all."""
from tilefuse.frontend.converters import elementwise, movement, nn, reduce  # noqa: F401
