"""Sphinx configuration of the kvcore documentation."""

from __future__ import annotations

import sys
from pathlib import Path

import kvcore

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "kvcore"
author = "the kvcore developers"
copyright = "2026, the kvcore developers"
release = kvcore.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx.ext.intersphinx",
    "kvcore_api",
    "kvcore_changelog",
    "kvcore_figures",
]

# Figures come from the records in benchmarks/results (docs/_ext/kvcore_figures.py);
# the changelog is dated history, not a claim about this version, and is not checked.
kvcore_records_dir = "../benchmarks/results"
kvcore_figures_exempt = {"changelog"}
# The check of typed-in figures (docs/_ext/kvcore_figures.py).
kvcore_figures_check = True

exclude_patterns = ["_build", "_ext", "_inventories"]
templates_path = []

# -- HTML: furo (as pytest and attrs); the on-page table of contents is its right column.
html_theme = "furo"
html_title = f"kvcore {release}"
html_short_title = "kvcore"
html_static_path = ["_static"]
html_css_files = ["kvcore.css"]
# A copy button on every code block (docs/_static/kvcore-copy.js): no extension needed.
html_js_files = ["kvcore-copy.js"]
html_copy_source = False
html_theme_options = {
    "navigation_with_keys": True,
    "top_of_page_buttons": [],
}
html_context = {"description": "Paged KV cache management for hybrid LLMs"}

# Literal blocks without a language are plain text: a command's output or a
# diagram must never be highlighted as Python. Code says what it is
# (``.. code-block:: python``, ``console``, ``toml``); the doc-example tests run
# every Python and console block (tests/docs/test_doc_examples.py).
highlight_language = "text"
pygments_style = "friendly"
pygments_dark_style = "monokai"

# -- API reference: one page per public module, generated from __all__ (docs/_ext).
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True
python_use_unqualified_type_names = True
add_module_names = False
toc_object_entries_show_parents = "hide"

# torch, numpy and pluggy types link to their projects' docs through
# inventories shipped in docs/_inventories (docs/_tools/inventories.py writes
# them): the build fetches nothing.
intersphinx_mapping = {
    "torch": ("https://pytorch.org/docs/stable/", "_inventories/torch.inv"),
    "numpy": ("https://numpy.org/doc/stable/", "_inventories/numpy.inv"),
    "pluggy": ("https://pluggy.readthedocs.io/en/stable/", "_inventories/pluggy.inv"),
}

# Every cross-reference must resolve (the build runs with -W): only types from
# outside kvcore that have no inventory are exempt.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(collections|typing|types|abc|pathlib|argparse|enum|array|time)\..*"),
    (r"py:.*", r"(attrs|attr|transformers)(\..*)?"),
    (r"py:.*", r"(Hashable|Sequence|Mapping|Iterable|Iterator|Callable|Any|ClassVar|Final)"),
    (r"py:.*", r"(Self|SpecT|KVCacheEvent|Literal|MambaCacheMode|Path|ndarray)"),
    (r"py:class", r"(int|str|bytes|float|bool|object|type|tuple|list|dict|set|frozenset)"),
    (r"py:.*", r".*\.(SpecT|Hits)$"),
]


def setup(app):
    """Add the ``:hook:`` cross-reference role used in the hook reference."""
    app.add_crossref_type("hook", "hook", objname="kvcore hook", indextemplate="pair: %s; hook")
