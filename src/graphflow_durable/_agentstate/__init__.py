"""Agent-state rows both ways: the encoder (splices of each state's JSON text against its
previous turn) and the decoder (folding rows back into states). Pure; no SQLAlchemy, no AutoGen.
"""
