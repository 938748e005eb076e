purge(0)
return redis.call('HGETALL', KEYS[3])
