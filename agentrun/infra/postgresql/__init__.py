"""Django's PostgreSQL backend with a lender: a step lends its pooled connection between writes."""
