"""Integrations of kvcore with inference engines and model libraries (optional extras).

Each subpackage needs its library installed: :mod:`kvcore.integrations.transformers`
needs ``pip install 'kvcore[transformers]'``. They use only kvcore's
engine-facing API and the helpers of :mod:`kvcore.paging`.
"""

from __future__ import annotations

__all__: list[str] = []
