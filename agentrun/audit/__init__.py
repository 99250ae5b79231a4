"""The audit trail: the append-only event log of what the system and the operators did.

`events` is the one way to write to it; `dbroles` sets up the least-privilege database role
that may only append to and read the log, never change it.
"""
