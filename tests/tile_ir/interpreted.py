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


def mismatches(lowered, values: dict, want: dict) -> list[str]:
    """What ``lowered`` computes in the interpreter for each of its outputs, against the
    reference's value (``values``, by id) and onnxruntime's (``want``, by name, where it
    has one): a line per output and peer beyond tolerance."""
    from tilefuse.compare import compare_output

    bad = []
    for v, got in interpret(lowered, values):
        for what, expected in (("reference", values[id(v)]), ("onnxruntime", want.get(v.name))):
            c = compare_output(v.name, got, expected) if expected is not None else None
            if c is not None and not c.ok:
                bad.append(f"{v.name} against {what} ({lowered.program.notes[0]}): {c.problem}")
    return bad
