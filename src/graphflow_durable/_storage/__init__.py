"""The only SQL: engines, URLs, schema, migrations, statements, commits, leases and the work
queue. Knows nothing of AutoGen: values in and out are JSON and :mod:`graphflow_durable._model`.
"""
