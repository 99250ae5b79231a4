"""Django's PostgreSQL backend, whose pool hands out only connections that work."""
