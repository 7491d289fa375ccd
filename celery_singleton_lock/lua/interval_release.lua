-- Release a hold (now, or after a delay during which its interval stays locked with no
-- renewal), withdraw a waiter's reservation, or clear a holder for the admin tools.
-- KEYS: see interval_common.lua (1..12; KEYS[8] is the holder's hash)
-- ARGV[1]: owner token   ARGV[2]: delay, ms (0: free now)   ARGV[3]: wake-up channel
-- ARGV[4]: fencing token the holder must have ('' : any)
-- ARGV[5]: renewed_ms the holder must still have ('' : any): the admin's clear of a hold it
--          listed stale leaves it alone once its heartbeat resumed
-- returns 1   released (or, for a waiter, its reservation withdrawn)
--         0   not held: the hold expired (or was cleared)
--        -1   the holder's fencing token is not ARGV[4]
--        -2   the holder was renewed since it was listed (renewed_ms is not ARGV[5])
-- Waiters are woken only if one marked the lock (see mark_waiting).
local owner = ARGV[1]
prune(0, true)
local woke = false
if unreserve(owner) > 0 then
  woke = true
end
local expiry = redis.call('ZSCORE', KEYS[1], owner)
local result = 0
if expiry then
  if ARGV[4] ~= '' and redis.call('HGET', KEYS[8], 'token') ~= ARGV[4] then
    return -1
  end
  local renewed = redis.call('HGET', KEYS[8], 'renewed_ms')
  if ARGV[5] and ARGV[5] ~= '' and tonumber(renewed) ~= tonumber(ARGV[5]) then
    return -2
  end
  local delay = tonumber(ARGV[2])
  if delay > 0 then
    -- Delay-after: keep the indexed interval until the delay ends; nothing renews it now.
    redis.call('ZADD', KEYS[1], now_ms + delay, owner)
    redis.call('HSET', KEYS[8], 'state', 'cooldown', 'released_ms', now_ms)
    redis.call('PEXPIRE', KEYS[8], delay)
    refresh(0)
  else
    remove_holder(owner)
    woke = true
  end
  result = 1
elseif woke then
  result = 1
end
if woke then
  wake(ARGV[3], 'released')
end
return result
