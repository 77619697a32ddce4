"""Tile IR: TileProgram, its verifier, printer and numpy interpreter, and the lowering
of fusion groups (one TileProgram per group)."""
from tilefuse.tile_ir.interpret import run_program
from tilefuse.tile_ir.ir import TileProgram
from tilefuse.tile_ir.lower import Lowered, lower_group
from tilefuse.tile_ir.printer import format_program
from tilefuse.tile_ir.verify import verify_program

__all__ = ["Lowered", "TileProgram", "format_program", "lower_group", "run_program", "verify_program"]
