"""Plumbing under everything: Celery transports, the database backend and process tuning.

`broker` is the embedded mode's filesystem transport with atomic writes, `redis` kombu's
Redis transport with one client per channel, `logs` the filter that keeps routine task lines
quiet; the rest adapts Django's PostgreSQL backend and glibc's allocator to the worker's
many threads.
"""
