"""The side systems, beside the request's way: ``sim`` (the vLLM simulator the demo and the
tests run), ``siem`` (the ledger's export to a SIEM), ``witness`` (a C2SP witness for other
logs) and ``console`` (the auditor console's pages). The request's way (``edge`` → ``routes``
→ ``pipeline`` → ``admission`` → ``upstream`` → ``exchange`` → ``relay`` → ``ledger``) never
imports them; the app wires them in."""
