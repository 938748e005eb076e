"""Guardrail policies: detectors over the reasoning and the answer as they stream, and what
a policy does with a match (docs/guardrails.md)."""
