"""Agent-state rows both ways: the writer (splices of each state's JSON text against its
previous turn) and the reader (folding rows back into states). Pure; no SQLAlchemy, no AutoGen.
"""
