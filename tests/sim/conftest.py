from __future__ import annotations

from pathlib import Path

import pytest
from simhelpers import CONVERSATION


@pytest.fixture
def conversation_trace() -> Path:
    assert CONVERSATION.is_file(), (
        f"{CONVERSATION} is missing: these tests read the Mooncake traces from the shared "
        "data folder; set KVCORE_DATA to the folder holding mooncake/"
    )
    return CONVERSATION
