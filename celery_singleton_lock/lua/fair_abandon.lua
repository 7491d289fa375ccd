-- A fair waiter stops waiting: leave the queue, drop its registration and hand-off list.
-- KEYS[1]: lock hash   KEYS[2]: queue of fair waiters
-- KEYS[3]: the waiter's registration hash   KEYS[4]: its hand-off list
-- ARGV[1]: the waiter's owner token
-- returns the fencing token if a release handed the lease to it meanwhile (it then holds it
-- and keeps it, as if taken at its deadline), else 0
redis.call('LREM', KEYS[2], 0, ARGV[1])
redis.call('DEL', KEYS[3], KEYS[4])
local holder = redis.call('HMGET', KEYS[1], 'owner', 'token')
if holder[1] == ARGV[1] then
  return holder[2]
end
return 0
