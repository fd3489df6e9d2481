"""What runs in the notebook's kernel: the notebook API, a client of the server's REST API.

``client.py`` finds the Jupyter server and calls its API, ``widget.py`` is the
``Run`` widget and ``runtable.py`` shows ``runs()`` as a table. None of it
imports the server (its handlers, engine, store, agents or notebook tools):
only the pure modules both sides share (the lifecycle, the run's record,
JSON, words). ``lint-imports`` holds both directions.
"""
