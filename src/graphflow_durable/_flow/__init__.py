"""The :class:`~graphflow_durable.flow.DurableGraphFlow` facade's parts besides its construction, its
run and its state: the public methods over its stored run (stored) and what a call does on the
run it attached, and after an interrupt (start). Import the flow from :mod:`graphflow_durable.flow`.
"""
