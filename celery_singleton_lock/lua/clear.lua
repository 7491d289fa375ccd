-- Clear a lease for an administrator, only if it still has the holder that was listed.
-- KEYS[1]: lock hash
-- ARGV[1]: expected fencing token (of the holder, or of the release delay it left behind)
-- ARGV[2]: wake-up channel
-- ARGV[3]: the holder's renewed_ms when it was listed stale ('': do not check; a forced
--          clear, or a release delay)
-- Reply codes: ClearReply in core/replies.py (keep the two in step).
-- returns 1   cleared; waiters were woken
--         0   gone: released or expired since it was listed
--        -1   another holder has the name now: left alone
--        -2   renewed since it was listed stale (its heartbeat resumed): left alone
-- Waiters mark the hash (acquire.lua): only a marked one is published, and its oldest live
-- fair waiter is woken to take the freed name itself (wake_fair_waiter.lua, prepended).
-- The holder whose lease was cleared finds out at its next heartbeat (renew.lua returns 0).
-- A hold not renewed yet has no renewed_ms: its acquired_ms stands for it (acquire.lua).
-- A hold it frees leaves its trace in P{T}:freed (trace.lua) for as long as the hold had
-- left: its token and `cleared=clear`, no owner. The same clear sent again after its reply
-- was lost (redis-py's retry) finds it there and answers cleared, not gone; the holder's own
-- release finds no owner of its there, so its lease lost, not released.
local freed = string.sub(KEYS[1], 1, -5) .. 'freed'
local holder = redis.call('HMGET', KEYS[1], 'token', 'renewed_ms', 'waiting', 'acquired_ms')
if holder[1] ~= ARGV[1] then
  local trace = advisory('HMGET', freed, 'token', 'cleared') or {}
  if trace[1] == ARGV[1] and trace[2] == 'clear' then
    return 1
  end
end
if not holder[1] then
  return 0
end
if holder[1] ~= ARGV[1] then
  return -1
end
if ARGV[3] ~= '' and tonumber(holder[2] or holder[4]) ~= tonumber(ARGV[3]) then
  return -2
end
leave_trace(KEYS[1], freed, 'token', holder[1], 'cleared', 'clear')
if holder[3] then
  redis.call('PUBLISH', ARGV[2], 'cleared')
  wake_fair_waiter(string.sub(KEYS[1], 1, -5))
end
return 1
