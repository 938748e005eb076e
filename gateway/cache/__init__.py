"""The cluster's prefix cache, as the gateway sees it (sans-I/O): vLLM's KV events decoded, an
index of which engine holds which block, the blocks a prompt will occupy, and the scorer that
weighs a cached prefix against an engine's load (``docs/routing.md``)."""
