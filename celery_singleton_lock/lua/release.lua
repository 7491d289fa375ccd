-- Release a lease, now or after a delay during which the name stays locked with no owner.
-- KEYS[1]: lock hash
-- ARGV[1]: owner token   ARGV[2]: delay, ms (0: free now)   ARGV[3]: wake-up channel
-- Publishes only if a waiter marked the hash (see acquire.lua): an uncontended release does
-- not pay for it. A delay-after release publishes nothing: waiters look again when it ends.
-- returns 1   released
--         0   not held: the lease expired and nobody holds the name
--        -1   another owner holds the name (or it is in another holder's delay-after)
local holder = redis.call('HMGET', KEYS[1], 'owner', 'waiting')
local owner = holder[1]
if not owner then
  return 0
end
if owner ~= ARGV[1] then
  return -1
end
local delay = tonumber(ARGV[2])
if delay > 0 then
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('HSET', KEYS[1], 'owner', '', 'state', 'cooldown', 'released_ms', now_ms)
  redis.call('PEXPIRE', KEYS[1], delay)
else
  redis.call('DEL', KEYS[1])
  if holder[2] then
    redis.call('PUBLISH', ARGV[3], 'released')
  end
end
return 1
