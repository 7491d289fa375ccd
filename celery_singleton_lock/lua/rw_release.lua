-- Release a hold (now, or after a delay during which it stays held with no renewal),
-- withdraw a waiting writer's reservation, or clear a hold for the admin tools.
-- KEYS[1]: B exp   KEYS[2]: B h:<owner> (see rw_common.lua)
-- ARGV[1]: owner token   ARGV[2]: delay, ms (0: free now)
-- ARGV[3]: fencing token the hold must have ('' : any)
-- ARGV[4]: renewed_ms the hold must still have ('' : any): the admin's clear of a hold it
--          listed stale leaves it alone once its heartbeat resumed
-- Reply codes: ClearReply in core/replies.py (keep the two in step).
-- returns 1   released (or, for a waiter, its reservation withdrawn)
--         0   not held: the hold expired (or was cleared)
--        -1   the hold's fencing token is not ARGV[3]
--        -2   the hold was renewed since it was listed (renewed_ms is not ARGV[4])
-- Waiters are woken only if one marked the lock (see mark_waiting).
local owner = ARGV[1]
local delay = tonumber(ARGV[2])
local token, renewed = ARGV[3] or '', ARGV[4] or ''
local holder = redis.call('HMGET', KEYS[2], 'mode', 'token', 'renewed_ms', 'acquired_ms')
local mode = holder[1]
local woke = false
-- Only a waiting writer or upgrade queues a reservation (a write hold drops its own when
-- it is taken, an upgraded one when it is upgraded).
if not mode or mode == 'u' then
  -- A hash read first: WRONGTYPE on a lock of the previous layout (see rw_common.lua).
  if redis.call('HEXISTS', KEYS[1], 'q') == 1 then
    woke = unreserve(owner)
  end
  if not mode then
    if woke then
      wake('released')
      return 1
    end
    return 0
  end
end
if token ~= '' and holder[2] ~= token then
  return -1
end
-- A hold not renewed yet has no renewed_ms: its acquired_ms stands for it.
if renewed ~= '' and tonumber(holder[3] or holder[4]) ~= tonumber(renewed) then
  return -2
end
local field = mode
if mode == 'r' then
  field = 'r:' .. owner
end
if delay > 0 then
  -- Release delay: the hold stays in B exp until its hash runs out; nothing renews it now.
  now()
  redis.call('HEXISTS', KEYS[1], field)  -- a hash, as above
  redis.call('HSET', KEYS[2], 'state', 'cooldown', 'released_ms', now_ms)
  redis.call('PEXPIRE', KEYS[2], delay)
  keep(delay)
  if woke then
    wake('released')
  end
  return 1
end
redis.call('HDEL', KEYS[1], field)
redis.call('DEL', KEYS[2])
wake('released')
return 1
