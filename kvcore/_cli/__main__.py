"""``python -m kvcore._cli``: the same as the ``kvcore`` command."""

from __future__ import annotations

import sys

from kvcore._cli.main import main

sys.exit(main())
