"""Starlette plumbing every route shares: the front door, bounded body reading, the streaming
response racing the client's disconnect, background servers.
"""
