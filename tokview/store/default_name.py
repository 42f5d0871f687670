"""Re-export of the store's default file name for store.py; the one definition is tokview/default_store.py
(a leaf outside this package, so building a command's parser does not import the store)."""

from tokview.default_store import DEFAULT_DB as DEFAULT_DB
