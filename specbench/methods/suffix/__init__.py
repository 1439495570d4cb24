"""`suffix`: SuffixDecoding's suffix index (index.py), its per-request and global caches (cache.py) and the method
that drafts trees from them and verifies them (method.py)."""
