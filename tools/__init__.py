"""Tooling of the repository, not shipped with the gateway: the generators of the documentation
site's pages (``make docs``)."""
