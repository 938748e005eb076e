"""Metrics, logs and trace context."""
