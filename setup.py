"""The compiled part of kvcore: everything else is configured in pyproject.toml.

``kvcore._native`` (kvcore/_native.c, CPython's C API only) is optional: when
the machine has no C compiler or the build fails, setuptools reports it and
installs kvcore without it, and kvcore then runs its Python backend (it says
so once, when a pool is first made). KVCORE_NATIVE_CFLAGS adds compiler flags
(the sanitizer build of .ci/native_sanitize uses it).
"""
from __future__ import annotations

import os
import shlex

from setuptools import Extension, setup

extra = shlex.split(os.environ.get("KVCORE_NATIVE_CFLAGS", ""))

setup(
    ext_modules=[
        Extension(
            "kvcore._native",
            sources=["kvcore/_native.c"],
            extra_compile_args=["-O2", "-std=c11", *extra],
            extra_link_args=[flag for flag in extra if flag.startswith("-fsanitize")],
            optional=True,
        )
    ]
)
