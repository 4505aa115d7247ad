"""Sphinx configuration of the kvcore documentation."""

from __future__ import annotations

import kvcore

project = "kvcore"
author = "kvcore developers"
release = kvcore.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path = ["_static"]
html_theme_options = {"description": "KV cache management for hybrid LLMs", "fixed_sidebar": True}

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True

# Every cross-reference must resolve (the build runs with -W): only types from
# outside kvcore, which have no inventory offline, are exempt.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(collections|typing|types|abc|pathlib|argparse|enum|array)\..*"),
    (r"py:.*", r"(attrs|attr|pluggy|numpy|np|torch)(\..*)?"),
    (r"py:.*", r"(Hashable|Sequence|Mapping|Iterable|Iterator|Callable|Any|ClassVar|Final)"),
    (r"py:.*", r"(Self|SpecT|KVCacheEvent|Literal|MambaCacheMode|Path|ndarray)"),
    (r"py:class", r"(int|str|bytes|float|bool|object|type|tuple|list|dict|set|frozenset)"),
    (r"py:.*", r".*\.(SpecT|Hits)$"),
]


def setup(app):
    """Add the ``:hook:`` cross-reference role used in the hook reference."""
    app.add_crossref_type("hook", "hook", objname="kvcore hook", indextemplate="pair: %s; hook")
