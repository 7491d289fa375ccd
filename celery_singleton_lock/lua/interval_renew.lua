-- Renew several interval holds in one call (the heartbeat tick, and extend with one hold).
-- KEYS[8(i-1)+1 .. 8i]: keys 1..8 of hold i's lock (see interval_common.lua)
-- ARGV[3i-2]: owner token of hold i   ARGV[3i-1]: new lease length of hold i, ms
-- ARGV[3i]: generation of the renewal: one older than the hold's `gen` leaves it alone and
--           answers the ms it has (see renew.lua)
-- Reply codes: Reply in core/replies.py (keep the two in step): ms granted (> 0),
-- GONE 0, MAX_HOLD_REACHED -2.
-- returns one integer per hold: > 0 ms granted, 0 gone (or released: a hold in a release delay
-- is never renewed, so a renewal sent before a delayed release cannot cut the delay short),
-- -2 max-hold reached
-- The remaining time is *set*, never added to (renew_hold.lua).
local result = {}
overlap_helpers()
now()
for i = 1, #KEYS / 8 do
  local o = 8 * (i - 1)
  local owner = ARGV[3 * i - 2]
  local gen = tonumber(ARGV[3 * i])
  local expiry = tonumber(redis.call('ZSCORE', KEYS[o + 1], owner))
  local holder = redis.call('HMGET', KEYS[o + 8], 'deadline_ms', 'state', 'gen')
  local stored = tonumber(holder[3]) or 0
  if not expiry or expiry <= now_ms then
    prune(o, false)
    result[i] = 0
  elseif holder[2] == 'release_delay' then
    result[i] = 0
  elseif gen < stored then
    result[i] = math.max(1, expiry - now_ms)
  else
    result[i] = renew_to(KEYS[o + 8], ARGV[3 * i - 1], tonumber(holder[1]) or 0, gen, stored)
    if result[i] > 0 then
      redis.call('ZADD', KEYS[o + 1], now_ms + result[i], owner)
      refresh(o)
    end
  end
end
return result
