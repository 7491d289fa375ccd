-- Change a held interval in place: shrink it, upgrade an upgradable hold to write, or
-- downgrade a write hold (that was upgraded) back to upgradable; or withdraw the reservation
-- of an upgrade that stopped waiting (unreserve).
-- KEYS: see interval_common.lua (1..12; KEYS[8] is the holder's hash)
-- ARGV[1]: shrink | upgrade | downgrade | unreserve    ARGV[2]: owner token
-- ARGV[3], ARGV[4]: new lo, hi (shrink)
-- ARGV[5]: reservation, ms (upgrade; 0: none, and the caller will not wait)
-- ARGV[6]: wake-up channel
-- Reply codes: Reply in core/replies.py (keep the two in step): DONE 1, BUSY -7,
-- PARENT_GONE -3, NOT_INSIDE -4.
-- returns {1, 0}    done
--         {-7, ms}  upgrade blocked by readers; ms until one could run out
--         {-3, 0}   not held (expired or cleared), or not in the mode the change needs
--         {-4, 0}   shrink: the new interval is not inside the held one
local op, owner = ARGV[1], ARGV[2]
overlap_helpers()
prune(0, true)
if op == 'unreserve' then
  if unreserve(owner) > 0 then
    refresh_queue()
    redis.call('PUBLISH', ARGV[6], 'withdrawn')
  end
  return {1, 0}
end
if not redis.call('ZSCORE', KEYS[1], owner) then
  return {-3, 0}
end
local mode = redis.call('HGET', KEYS[8], 'mode')
local m = MODES[mode]
if not m then
  return {-3, 0}
end
local lo = redis.call('ZSCORE', KEYS[m], owner)
local hi = redis.call('ZSCORE', KEYS[m + 1], owner) or 'inf'  -- see interval_common.lua
if op == 'shrink' then
  if tonumber(ARGV[3]) < tonumber(lo) or tonumber(ARGV[4]) > tonumber(hi) then
    return {-4, 0}
  end
  redis.call('ZADD', KEYS[m], ARGV[3], owner)
  if tonumber(ARGV[4]) ~= math.huge then
    redis.call('ZADD', KEYS[m + 1], ARGV[4], owner)
    refresh(0, {m + 1})  -- the key may be new: it had no entry of a hold up to +inf
  end
  redis.call('HSET', KEYS[8], 'lo', ARGV[3], 'hi', ARGV[4])
  redis.call('PUBLISH', ARGV[6], 'shrunk')
  return {1, 0}
end
local from, to = 'u', 'w'
if op == 'downgrade' then
  from, to = 'w', 'u'
end
if mode ~= from then
  return {-3, 0}
end
if op == 'upgrade' then
  -- Writes nested in this hold also overlap it: they block the upgrade like other writers.
  if overlapping(KEYS[2], KEYS[3], lo, hi) > 0 or overlapping(KEYS[6], KEYS[7], lo, hi) > 0 then
    local reserve = tonumber(ARGV[5])
    if reserve > 0 then
      redis.call('ZADD', KEYS[9], lo, owner)
      redis.call('ZADD', KEYS[10], hi, owner)
      redis.call('ZADD', KEYS[11], now() + reserve, owner)
      refresh_queue()
    end
    local ms = hint('w')
    if reserve > 0 then
      mark_waiting(ms)
    end
    return {-7, ms}
  end
  if unreserve(owner) > 0 then
    refresh_queue()
  end
end
redis.call('ZREM', KEYS[m], owner)
redis.call('ZREM', KEYS[m + 1], owner)
local n = MODES[to]
redis.call('ZADD', KEYS[n], lo, owner)
if tonumber(hi) ~= math.huge then
  redis.call('ZADD', KEYS[n + 1], hi, owner)
end
redis.call('HSET', KEYS[8], 'mode', to)
refresh(0)
if op == 'downgrade' then
  redis.call('PUBLISH', ARGV[6], 'downgraded')
end
return {1, 0}
