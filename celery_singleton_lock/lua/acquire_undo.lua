-- Undo what a lease acquire call may have taken when an attempt of it failed after its send
-- (its reply lost: a timeout, a dropped connection), as far as that is its own doing.
-- KEYS[1]: lock hash
-- ARGV[1]: the call's owner token
-- ARGV[2]: the call's id (acquire.lua's ARGV[8]); '' when the owner token is the call's own
--          (random, made for it), so whatever that owner holds, this call took
-- Reply codes: Reply in core/replies.py (keep the two in step): CLAIM_RESTORED -8,
-- HELD -9, GONE 0.
-- returns -8  it had taken a claim over: the claim is back, as it was (acquire.lua kept it)
--         -9  it holds the name: the caller releases it (release.lua, which wakes waiters)
--         0   nothing of this call's: not held by that owner, or held by that owner since
--             before this call (a claim token holding already: left alone)
local holder = redis.call('HMGET', KEYS[1], 'owner', 'token', 'attempt')
if holder[1] ~= ARGV[1] then
  return 0
end
if ARGV[2] ~= '' and holder[3] ~= ARGV[2] then
  return 0
end
local kept = string.sub(KEYS[1], 1, -5) .. 'undo:' .. holder[2]
local found = advisory('EXISTS', kept)
if found == nil then
  -- Kept on the other node of a migrating slot (advisory.lua): try again, as acquire.lua.
  return redis.error_reply('TRYAGAIN a kept claim is on another node while its slot migrates')
end
if found == 1 then
  redis.call('RENAME', kept, KEYS[1])
  return -8
end
return -9
