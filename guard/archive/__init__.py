"""The workspace database (SQLite, WAL) and the git archive of accepted candidates."""
