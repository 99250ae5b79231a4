"""The dashboard: the time-travel debugger in the browser, a Django app over the runtime.

Thin views (`views`) over the runtime's models and services, with what presents them:
`timeline` and `charts` for the run page, `diffs`, `states` and `jsontree` for snapshots,
`forks` and `forms` for the fork page, `compare`, `audit`, `search` (the run page's form),
`access` (who may see and do what). It imports the runtime; the runtime never imports it.
"""
