"""Anthropic's Messages API as its reference defines it: ``request`` parses a request into the
chat completion the engine is asked for, with ``system`` (the system prompt and the tool
changes system messages carry), ``text`` (content blocks as text), ``thinking`` (thinking
blocks and the ``thinking`` parameter), ``tools`` (client and server tools) and ``turns`` (the
conversation's turns, reasoning handed back)."""
