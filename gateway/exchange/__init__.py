"""One completion's life for every completion-style route: lifecycle (settle and record exactly
once).
"""
