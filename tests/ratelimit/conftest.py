"""The Redis fixtures of the rate-limit suites (``redis_url``, ``key_prefix``) live in
``tests/conftest.py``: the gateway's end-to-end tests need them too."""
