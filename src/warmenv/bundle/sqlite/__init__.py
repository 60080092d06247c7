"""The SQLite bundle: the environment's entries table in one file, with a manifest.

It is the native format: importing it into an environment is a copy inside
SQLite, never a trip through Python. The package holds everything of it:
`bundle` (the reader a caller holds, `SqliteBundle`), `file` (the SQL that
opens, checks, pages and hashes one), `staging` (the file export writes),
`sources` (what reading an export's sources means to its caller) and
`schema` (its formats, tables and version checks). Nothing outside it
touches a bundle's SQL but the two copies between a bundle and an
environment, which persistence runs as it runs every statement on an
environment (`warmenv.persistence.sqlite.bulk` in, `.export` out).
"""
