"""Planning: from a model's layers to KV cache groups, a block count and torch tensors.

One module per job: :mod:`.grouping` (which layers share a block table, with
:mod:`.unify`, :mod:`.packing` and :mod:`.group_size`), :mod:`.alignment`
(state pages next to attention pages), :mod:`.pool_choice` (the shared or the
two-level pool, and the Mamba checkpoint grid), :mod:`.page_classes` (a
two-level pool's page classes and large page), :mod:`.layout` (where every
page lives), :mod:`.needs` (what one request holds), :mod:`.sizing` (blocks
from memory, the fit check, concurrency) and :mod:`.two_level` (the same for
large pages), :mod:`.allocate` (torch), :mod:`.model_config` and
:mod:`.layer_config` (``config.json`` → layer specs), :mod:`.model_fields`
(the config fields a plugin's hook reads), :mod:`.report` (waste),
:mod:`.notes` and :mod:`.kv_cache_plan` (what a plan holds and says), :mod:`.plan`
(:func:`kvcore.plan`) and :mod:`.memory` (``"80GiB"``).

Nothing is imported here: ``kvcore`` imports the modules it re-exports.
"""
