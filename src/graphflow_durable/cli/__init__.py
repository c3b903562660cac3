"""Command-line shells over the library: each module has ``main(argv) -> int`` and ``entry()``.

``graphflow-repair`` (:mod:`graphflow_durable.cli.repair`) checks and repairs saved team states.
"""
