"""The run console in the browser: ``graphflow-durable ui`` and :func:`create_app` (extra ``ui``)."""
