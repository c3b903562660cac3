"""The :class:`~graphflow_durable.worker.Worker`'s parts besides its loop: the pause after database
problems (backoff) and the drive of one claimed run to its outcome (drive). Import the worker from
:mod:`graphflow_durable.worker`.
"""
