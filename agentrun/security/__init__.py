"""What may enter and what may leave: the JSON policy, secret redaction and roles.

`storable` is the one policy for JSON at every entry (depth, size, numbers, text the
database can store); `redact` keeps secrets out of everything stored, logged or shown;
`roles` says who may read (viewer), act (operator) and administer (admin).
"""
