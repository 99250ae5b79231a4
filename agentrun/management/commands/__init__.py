"""`manage.py` commands: start, fork, watch, export and import runs; users, roles, tokens and
the database role; the reconciler, retention and derived data by hand; `up` and the demo.
"""
