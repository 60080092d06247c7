"""Environments stored in SQLite: one database file holding every namespace a machine warmed.

`database` opens the file (read-write, or read-only where it cannot be
written) and holds the connection; `storage` is one namespace of it (the
`Storage` protocol); `schema` states what the file looks like and the rules
its SQL applies (the insert rule, transactions); `statistics`, `eviction` and
`bulk` are the SQL of lookup counts, of gc and quarantine, and of an
import's bulk copy; `export` what an export reads from environments (every
statement on an environment is in this package); `uris` chooses how an
existing file is opened.
"""
