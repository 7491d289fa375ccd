-- Renew several reader-writer holds in one call (the heartbeat tick, and extend with one).
-- KEYS[2i-1], KEYS[2i]: B exp and B h:<owner> of hold i (see rw_common.lua)
-- ARGV[3i-2]: owner token of hold i   ARGV[3i-1]: new lease length of hold i, ms
-- ARGV[3i]: generation of the renewal: one older than the hold's `gen` leaves it alone and
--           answers the ms it has (see renew.lua)
-- Reply codes: Reply in core/replies.py (keep the two in step): ms granted (> 0),
-- GONE 0, MAX_HOLD_REACHED -2.
-- returns one integer per hold: > 0 ms granted, 0 gone (or released: a hold in a release delay
-- is never renewed, so a renewal sent before a delayed release cannot cut the delay short;
-- nor is the trace a release or clear leaves, state=released, see rw_release.lua),
-- -2 max-hold reached
-- The remaining time is *set*, never added to (renew_hold.lua). B exp is kept alive at least
-- as long.
local result = {}
for i = 1, #KEYS / 2 do
  local lock, hold = KEYS[2 * i - 1], KEYS[2 * i]
  local gen = tonumber(ARGV[3 * i])
  local holder = redis.call('HMGET', hold, 'mode', 'deadline_ms', 'state', 'gen')
  local stored = tonumber(holder[4]) or 0
  if not holder[1] or holder[3] then  -- gone, or a state: release_delay or released
    result[i] = 0
  elseif gen < stored then
    result[i] = math.max(1, redis.call('PTTL', hold))
  else
    result[i] = renew_to(hold, ARGV[3 * i - 1], tonumber(holder[2]) or 0, gen, stored)
    if result[i] > 0 and redis.call('PTTL', lock) < result[i] then
      redis.call('PEXPIRE', lock, result[i])
    end
  end
end
return result
