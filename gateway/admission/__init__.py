"""Everything a request passes before an engine is asked: rate limits, the KV budget, the Redis
connection and its circuit breaker.
"""
