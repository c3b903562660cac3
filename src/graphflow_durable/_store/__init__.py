"""The :class:`~graphflow_durable.store.Store`'s methods by group, one mixin each, over the store's
engines: runs, commits, history, leases, operations, human input. ``store.py`` composes them;
import the store from there. SQL lives in ``_storage``; nothing here imports AutoGen.
"""
