"""The internals of :mod:`graphflow_durable.integrity`: reading a saved state, the checks,
the findings' codes and what a thread explains. Pure; no SQLAlchemy, no I/O.
"""
