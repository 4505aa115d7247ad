"""The reference executor behind :mod:`kvcore.executor` and ``kvcore simulate --execute``.

Private: :mod:`kvcore.executor` is the supported interface. Modules, one job each:

* :mod:`.kernels` collects the plugins' reference kernels (the
  ``kvcore_reference_kernels`` hook).
* :mod:`.model` builds a tiny model from a plan: one layer per cache layer,
  random weights from a seed.
* :mod:`.executor` runs scheduled steps through the paged cache and records
  every output.
* :mod:`.oracle` runs the same model densely, with no cache.
* :mod:`.report` compares the two and reports mismatches.
* :mod:`.engine` is a continuous-batching engine loop that drives a
  ``KVCacheManager`` and the executor together.
* :mod:`.tiny` lists the tiny model configs shipped for it.
* :mod:`.simulate` connects the executor to ``kvcore simulate``.

Importing this package imports torch.
"""
