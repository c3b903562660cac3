"""The :class:`~graphflow_durable.store.Store`'s methods by group, one mixin each: runs, commits,
history, leases, operations, human input. ``store.py`` composes them and owns all the state (the
engines, the writer, the queue, the requests, set up when it opens); the groups hold none of their
own. Import the store from ``graphflow_durable.store``. SQL lives in ``_storage``; nothing here
imports AutoGen.
"""
