"""Integrations of kvcore into inference engines, each an optional subpackage.

Every subpackage imports its engine only when it is used, and uses kvcore's
public, engine-facing API only.
"""
