"""Integrations of kvcore with inference engines and model libraries (optional extras).

Each subpackage imports its library only when it is used and needs it
installed: :mod:`kvcore.integrations.transformers` needs ``pip install
'kvcore[transformers]'``, :mod:`kvcore.integrations.vllm` vLLM 0.14. They use
only kvcore's engine-facing API and the helpers of :mod:`kvcore.paging`.
"""

from __future__ import annotations

__all__: list[str] = []
