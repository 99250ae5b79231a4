"""The lifecycle of runs: what the API, the dashboard and the commands do to them.

`services` starts, cancels, approves, pins and forks runs (validating first, writing
nothing on bad input, recording each operator action as an event); `labels` holds the rules
of run labels; `runids` resolves the short ids people type; `archive` exports a run to a
self-contained, hash-checked archive and imports one read-only; `retention` purges the bulk
of finished runs while pinned runs and the audit trail stay.
"""
