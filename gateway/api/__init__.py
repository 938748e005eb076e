"""Wire-format request parsers, one module per API surface."""
