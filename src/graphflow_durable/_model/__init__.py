"""Pure values and rules: codec, records, the run position (cursor), buffers, graph identity,
the restore plan and the saved-state view. AutoGen's public types only; no SQLAlchemy, no I/O.
"""
