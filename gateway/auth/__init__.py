"""Keys: their format and hashing, the key store, bearer parsing."""
