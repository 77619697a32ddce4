"""codegen stage: TileProgram -> kernels (``cpu``: C and shared libraries; ``cuda``: TileLang and cubins)."""
