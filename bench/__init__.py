"""Benchmarks of jupyter_agentruns: ``python -m bench`` prints figures, not test results.

Each scenario runs against a real ``jupyter server`` started by the bench in a
subprocess, with clients in the bench's own process, and is compared with a
baseline measured in the same run (raw SQLite, psycopg's COPY into PostgreSQL,
a bare tornado SSE handler, or the same run without the disturbance). See
``python -m bench --help``.
"""
