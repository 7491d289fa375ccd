-- The key layout versions recorded under a prefix (core/layout.py): each kind's is written
-- by the first process that uses the prefix and never changed by a later one.
-- KEYS[1]: the prefix's layout hash (kind -> version)
-- ARGV: kind, version pairs of the calling process (none: a read that records nothing)
-- returns the recorded kind, version pairs (HGETALL), the caller's among them
for i = 1, #ARGV, 2 do
  redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
end
return redis.call('HGETALL', KEYS[1])
