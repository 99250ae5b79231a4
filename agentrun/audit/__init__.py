"""The audit trail: the append-only event log of what the system and the operators did.

`events` is the one way to write to it; `chain` holds how the database chains each event to
the one before it in its stream, and verifies the chains; `export` writes them out with
their hashes for review offline; `dbroles` sets up the least-privilege database role that
may only append to and read the log, never change it.
"""
