-- Release the leases of a multi-key lock (now, or after a delay during which each name stays
-- locked with no owner). Keys another owner holds now are left alone.
-- KEYS[1..n]: lock hashes   ARGV[1]: owner token   ARGV[2]: delay, ms (0: free now)
-- ARGV[3..2+n]: the wake-up channel of each name
-- ARGV[3+n..2+2n]: the fencing token of each name's hold (absent: not known): a name freed
-- now leaves its owner and token in P{T}:freed, as release.lua does (trace.lua)
-- Waiters mark the hash (acquire.lua): only a marked one is published, and its oldest live
-- fair waiter is woken to take the freed name itself (wake_fair_waiter.lua, prepended).
-- Reply codes: Reply in core/replies.py (keep the two in step): DONE 1, GONE 0,
-- TAKEN -1.
-- returns 1 all released; else -1 if some name is held by another owner, 0 if some expired
-- A release sent again after its reply was lost (redis-py's retry, or the caller's) finds
-- its names released, not lost or held by another: a release delay left names its owner
-- (`released_by`), a name freed now its hold's owner and token in P{T}:freed.
local now_ms = server_ms()
local delay = tonumber(ARGV[2])
local result = 1
for i, key in ipairs(KEYS) do
  local holder = redis.call('HMGET', key, 'owner', 'waiting', 'released_by', 'token')
  local owner = holder[1]
  local token = ARGV[2 + #KEYS + i]
  local freed = string.sub(key, 1, -5) .. 'freed'
  if owner == ARGV[1] then
    if delay > 0 then
      redis.call('HSET', key, 'owner', '', 'state', 'release_delay', 'released_ms', now_ms,
        'released_by', ARGV[1])
      redis.call('PEXPIRE', key, delay)
    else
      leave_trace(key, freed, 'owner', ARGV[1], 'token', holder[4])
      if holder[2] then
        redis.call('PUBLISH', ARGV[2 + i], 'released')
        wake_fair_waiter(string.sub(key, 1, -5))
      end
    end
  elseif owner == '' and holder[3] == ARGV[1] then
    -- released already, by this very call sent again
  elseif token and advisory('HGET', freed, 'owner') == ARGV[1] then
    -- freed already, by this very call sent again (its owner's trace: not a clear's)
  elseif owner then
    result = -1
  elseif result == 1 then
    result = 0
  end
end
return result
