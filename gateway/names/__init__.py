"""How the gateway names what it hands out and later reads back, shared by the request parsers
(``gateway.api``) and the relays (``gateway.relay``), which may not import each other: Responses
ids (``ids``) and the engine's tool names mapped to the client's (``tools``)."""
