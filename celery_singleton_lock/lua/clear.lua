-- Clear a lease for an administrator, only if it still has the holder that was listed.
-- KEYS[1]: lock hash
-- ARGV[1]: expected fencing token (of the holder, or of the delay-after it left behind)
-- ARGV[2]: wake-up channel
-- returns 1   cleared; waiters were woken
--         0   gone: released or expired since it was listed
--        -1   another holder has the name now: left alone
-- The holder whose lease was cleared finds out at its next heartbeat (renew.lua returns 0).
local token = redis.call('HGET', KEYS[1], 'token')
if not token then
  return 0
end
if token ~= ARGV[1] then
  return -1
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], 'cleared')
return 1
