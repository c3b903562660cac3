"""The scheduler's values (state); :mod:`graphflow_durable.scheduler` is their public home and
holds the rules. Import them from there.
"""
