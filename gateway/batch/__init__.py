"""Batches: files, the Batch API and Message Batches, run in idle capacity."""
