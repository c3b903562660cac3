"""Upstream conformance: AutoGen's own GraphFlow tests, run with DurableGraphFlow swapped in.

``python -m tests.upstream [--version 0.7.4]`` from the repository root, or the ``upstream``
marked test in ``test_upstream_conformance.py``. See ``conformance.py`` and CONTRIBUTING.md.
"""
