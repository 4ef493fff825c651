"""Checkpoints: how large (sizing), how written and read back (layouts)."""
