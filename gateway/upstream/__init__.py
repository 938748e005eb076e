"""The engines: transport, the one error translation, routing, retries, health."""
