from __future__ import annotations

import pytest
from docbuild import BuiltDocs, build_docs


@pytest.fixture(scope="session")
def built_docs(tmp_path_factory: pytest.TempPathFactory) -> BuiltDocs:
    """The documentation, built once for every doc test of the session."""
    return build_docs(tmp_path_factory.mktemp("docs"))
