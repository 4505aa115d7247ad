"""The compiled part of kvcore: everything else is configured in pyproject.toml.

``kvcore._native`` (kvcore/_native_module.c, the module; kvcore/_native.c,
the pool core; kvcore/_value_queue.c, the value eviction policies' queue;
CPython's C API only; and kvcore/_digest_table.c, plain C: the prefix map
over fixed-width digests) is
optional: when the machine has no C compiler or the build fails, setuptools
reports it and installs kvcore without it, and kvcore then runs its Python
backend (it says so once, when a pool is first made).

``kvcore._native_hash`` (kvcore/_native_hash.c) computes the chained block
hashes with OpenSSL's libcrypto, the library Python's own hashlib runs on; it
needs its headers (Debian: libssl-dev). It is optional too: without them the
build reports it, and the native backend hashes in Python, saying so once.
KVCORE_NATIVE_CFLAGS adds compiler flags to both (the sanitizer build of
.ci/native_sanitize uses it).
"""
from __future__ import annotations

import os
import shlex

from setuptools import Extension, setup

extra = shlex.split(os.environ.get("KVCORE_NATIVE_CFLAGS", ""))
link = [flag for flag in extra if flag.startswith("-fsanitize")]

setup(
    ext_modules=[
        Extension(
            "kvcore._native",
            sources=[
                "kvcore/_native_module.c",
                "kvcore/_native.c",
                "kvcore/_digest_table.c",
                "kvcore/_value_queue.c",
            ],
            depends=["kvcore/_native_core.h", "kvcore/_digest_table.h", "kvcore/_value_queue.h"],
            extra_compile_args=["-O2", "-std=c11", *extra],
            extra_link_args=link,
            optional=True,
        ),
        Extension(
            "kvcore._native_hash",
            sources=["kvcore/_native_hash.c"],
            libraries=["crypto"],
            extra_compile_args=["-O2", "-std=c11", *extra],
            extra_link_args=link,
            optional=True,
        ),
    ]
)
