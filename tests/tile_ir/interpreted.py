"""Run a lowered group in the tile interpreter on reference values (tests of several stages)."""
from __future__ import annotations

import numpy as np

from tilefuse.tile_ir.interpret import run_program


def interpret(lowered, values: dict) -> list:
    """(value, what the program computed for it) for each output of ``lowered``, its inputs
    bound from ``values`` (id(value) -> array, as the reference executor gives them)."""
    n_in = lowered.program.num_inputs
    args = [v.data if v.is_constant else values[id(v)] for v in lowered.bindings[:n_in]]
    outs = [np.zeros(v.type.shape, v.type.dtype.numpy) for v in lowered.bindings[n_in:]]
    run_program(lowered.program, [np.ascontiguousarray(a) for a in args] + outs)
    return list(zip(lowered.bindings[n_in:], outs))
