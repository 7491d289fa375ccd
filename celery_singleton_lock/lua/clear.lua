-- Clear a lease for an administrator, only if it still has the holder that was listed.
-- KEYS[1]: lock hash
-- ARGV[1]: expected fencing token (of the holder, or of the delay-after it left behind)
-- ARGV[2]: wake-up channel
-- ARGV[3]: the holder's renewed_ms when it was listed stale ('': do not check; a forced
--          clear, or a delay-after)
-- returns 1   cleared; waiters were woken
--         0   gone: released or expired since it was listed
--        -1   another holder has the name now: left alone
--        -2   renewed since it was listed stale (its heartbeat resumed): left alone
-- Waiters mark the hash (acquire.lua): only a marked one is published, and its oldest live
-- fair waiter (queued in P{T}:queue, registered in P{T}:w:W, blocked on P{T}:m:W; see
-- release.lua) is pushed 0, not a fencing token: it wakes and takes the freed name itself.
-- The holder whose lease was cleared finds out at its next heartbeat (renew.lua returns 0).
local holder = redis.call('HMGET', KEYS[1], 'token', 'renewed_ms', 'waiting')
if not holder[1] then
  return 0
end
if holder[1] ~= ARGV[1] then
  return -1
end
if ARGV[3] ~= '' and tonumber(holder[2]) ~= tonumber(ARGV[3]) then
  return -2
end
redis.call('DEL', KEYS[1])
if holder[3] then
  redis.call('PUBLISH', ARGV[2], 'cleared')
  local base = string.sub(KEYS[1], 1, -5)
  for _, waiter in ipairs(redis.call('LRANGE', base .. 'queue', 0, -1)) do
    local lifetime = redis.call('PTTL', base .. 'w:' .. waiter)
    if lifetime > 0 then
      redis.call('RPUSH', base .. 'm:' .. waiter, 0)
      redis.call('PEXPIRE', base .. 'm:' .. waiter, lifetime)
      break
    end
    redis.call('LREM', base .. 'queue', 1, waiter)  -- it died: its registration ran out
  end
end
return 1
