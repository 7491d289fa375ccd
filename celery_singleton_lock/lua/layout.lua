-- The key layout versions recorded under a prefix (core/layout.py): each kind's is written
-- by the first process that uses the prefix and never changed by a later one.
-- KEYS[1]: the prefix's layout hash (kind -> version)
-- ARGV[1]: how long the record lives from now, ms ('' a read: it records nothing)
-- ARGV[2..]: kind, version pairs of the calling process (recorded where none is)
-- returns the recorded kind, version pairs (HGETALL), the caller's among them
if ARGV[1] ~= nil and ARGV[1] ~= '' then
  for i = 2, #ARGV, 2 do
    redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return redis.call('HGETALL', KEYS[1])
