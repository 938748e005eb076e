"""The rewriters of the APIs other than chat (sans-I/O): each turns the engine's chat (or
completions) stream into its API's events, over the core's choices, splitter and guards
(``gateway.relay``): ``completions`` (legacy completions), ``responses`` with
``response_items`` and ``freeform`` (the Responses API), ``messages`` (Anthropic)."""
