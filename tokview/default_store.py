"""The store's default file name, defined here only: every command's `--db` and `Store()` read it.

A leaf module outside `tokview/store/`: importing the store package loads its schema and DuckDB
(~0.2 s), which building a command's parser must not pay."""

DEFAULT_DB = "tokview.duckdb"
