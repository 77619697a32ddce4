"""partition stage: not built yet (see DESIGN.md and the open issues)."""
