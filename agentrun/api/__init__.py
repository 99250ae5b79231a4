"""The JSON API under /api/: every operation declared once with Django Ninja.

`operations` holds the endpoints (small functions over the lifecycle's services and the
store's reads), `schemas` the request and response bodies (the one description of the
contract), `base` the API's conventions (JSON errors, authentication, the JSON policy on
every body), `urls` the routes and `openapi` the document generated from all of them at
/api/openapi.json.
"""
