"""Build the documentation once per test session (imported by name: tests/ has no packages).

The doc tests read what Sphinx actually produced: the doctrees (every code
block as rendered, docstrings and included files included) and the HTML.
"""

from __future__ import annotations

import io
import os
import sys
import warnings
from pathlib import Path

import attrs

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
TOOLS = DOCS / "_tools"
#: The shared data folder (third-party traces, read in place, never copied).
DATA = Path(os.environ.get("KVCORE_DATA", REPO.parent / "shared" / "data"))


@attrs.frozen
class BuiltDocs:
    """One HTML build of the docs: where it is and what Sphinx warned about."""

    html: Path
    warnings: str
    app: object  # sphinx.application.Sphinx, whose env holds the doctrees

    def doctree(self, docname: str) -> object:
        """The doctree of one page as read (before cross-references are resolved)."""
        return self.app.env.get_doctree(docname)  # type: ignore[attr-defined]

    @property
    def docnames(self) -> list[str]:
        """Every page, sorted."""
        return sorted(self.app.env.found_docs)  # type: ignore[attr-defined]


def build_docs(out: Path) -> BuiltDocs:
    """Build the HTML docs into ``out`` with the project's conf.py (fresh environment)."""
    from sphinx.application import Sphinx

    warning = io.StringIO()
    with warnings.catch_warnings():
        # Sphinx and docutils deprecations are theirs to fix, not test failures.
        warnings.simplefilter("ignore")
        app = Sphinx(
            srcdir=DOCS,
            confdir=DOCS,
            outdir=out / "html",
            doctreedir=out / "doctrees",
            buildername="html",
            status=None,
            warning=warning,
            freshenv=True,
            keep_going=True,
        )
        app.config.nitpicky = True
        app.build()
    return BuiltDocs(html=out / "html", warnings=warning.getvalue(), app=app)


def import_tool(name: str) -> object:
    """Import a module of ``docs/_tools`` (the checks .ci/run runs on the real build)."""
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))
    return __import__(name)
