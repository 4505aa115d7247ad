"""Eviction policies: the built-in ones, and choosing one by name.

Private: users choose a policy by name (``KVCacheManager(eviction=...)``) and
write their own against :mod:`kvcore.eviction`.
"""
