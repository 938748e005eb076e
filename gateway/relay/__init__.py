"""Sans-I/O only: the SSE codec, reasoning formats, the splitter, per-choice state and the
rewriters of upstream output.
"""
