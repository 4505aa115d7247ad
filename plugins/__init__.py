"""kvcore's built-in attention types, one plugin package each.

Each package holds its spec, its manager and its hook implementations, and is
registered through its own entry point in the ``kvcore`` group, exactly as a
third-party plugin would be. Plugins use only kvcore's public API.
"""
