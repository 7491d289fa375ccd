-- Release a lock on behalf of a holder process that can no longer do it itself (a worker
-- child killed by a hard time limit, revoked with terminate, or lost): the worker's main
-- process knows the task id, the child's pid and its host, not the owner token.
-- The host is matched too: pids are reused across machines (and containers). A claim (owner
-- 'claim:...', see celery/claims.py) is never released here: it was handed over for the task's
-- next attempt and still carries the task id and pid of the run that handed it over.
-- 'claim:' below is CLAIM_OWNER_PREFIX of kinds/lease.py, which a script cannot import.
-- KEYS[1]: lock hash
-- ARGV[1]: task id   ARGV[2]: pid   ARGV[3]: host
-- ARGV[4]: delay, ms (0: free now)   ARGV[5]: wake-up channel
-- Waiters mark the hash (acquire.lua): only a marked one is published, and its oldest live
-- fair waiter is woken to take the freed name itself (wake_fair_waiter.lua, prepended).
-- Reply codes: HolderReply in core/replies.py (keep the two in step).
-- returns 1 released; 0 the lock is not held by that task in that process on that host
-- A hold keeps task id, pid and host in its packed `holder` field (acquire.lua); a hand-over
-- (handover.lua) writes them as fields of their own, which win.
-- A release it makes leaves 'holder <task id> <pid> <host>' behind: as `released_by` of the
-- release delay, or as `cleared` of its trace in P{T}:freed (trace.lua), with no owner, for
-- as long as the hold had left: the holder's own release must find its lease lost. The same
-- call sent again after its reply was lost (redis-py's retry) finds it and answers released;
-- it never frees anything else for it.
local base = string.sub(KEYS[1], 1, -5)
local who = 'holder ' .. ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3]
local holder = redis.call('HMGET', KEYS[1], 'owner', 'task_id', 'pid', 'host', 'waiting',
  'holder', 'released_by', 'token')
local function done_before()
  if holder[1] == '' and holder[7] == who then
    return 1
  end
  return advisory('HGET', base .. 'freed', 'cleared') == who and 1 or 0
end
local owner = holder[1]
if not owner or owner == '' or string.sub(owner, 1, 6) == 'claim:' then
  return done_before()
end
if holder[6] then
  local packed, found = cmsgpack.unpack(holder[6]), {}
  for i = 1, #packed - 1, 2 do
    found[packed[i]] = packed[i + 1]
  end
  -- A field of its own wins, as in the listing.
  holder[2] = holder[2] or found['task_id']
  holder[3] = holder[3] or found['pid']
  holder[4] = holder[4] or found['host']
end
if holder[2] ~= ARGV[1] or holder[3] ~= ARGV[2] or holder[4] ~= ARGV[3] then
  return done_before()
end
if tonumber(ARGV[4]) > 0 then
  redis.call('HSET', KEYS[1], 'owner', '', 'state', 'release_delay', 'released_by', who)
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
else
  leave_trace(KEYS[1], base .. 'freed', 'token', holder[8], 'cleared', who)
  if holder[5] then
    redis.call('PUBLISH', ARGV[5], 'released')
    wake_fair_waiter(string.sub(KEYS[1], 1, -5))
  end
end
return 1
