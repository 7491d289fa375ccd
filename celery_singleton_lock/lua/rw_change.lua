-- Upgrade an upgradable hold to write, downgrade a write hold (that was upgraded) back to
-- upgradable, or withdraw the reservation of an upgrade that stopped waiting (unreserve).
-- KEYS[1]: B exp   KEYS[2]: B h:<owner> (see rw_common.lua)
-- ARGV[1]: upgrade | downgrade | unreserve    ARGV[2]: owner token
-- ARGV[3]: reservation, ms (upgrade; 0: none, and the caller will not wait)
-- Reply codes: Reply in core/replies.py (keep the two in step): DONE 1, BUSY -7,
-- PARENT_GONE -3.
-- returns {1, 0}    done; also when the hold is in the mode the change makes already: this
--                   very change sent again after its reply was lost (a hold changes mode only
--                   by its holder's calls, one at a time)
--         {-7, ms}  upgrade blocked by readers; ms until one could run out
--         {-3, 0}   not held (expired, cleared or released), or not in the mode the change
--                   needs
local op, owner = ARGV[1], ARGV[2]
helpers()
local state = redis.call('HMGET', KEYS[1], 'w', 'q')
if op == 'unreserve' then
  if state[2] and unreserve(owner) then
    redis.call('PUBLISH', base .. 'chan', 'withdrawn')
  end
  return {1, 0}
end
local hold = redis.call('HMGET', KEYS[2], 'mode', 'state')
local mode = hold[1]
local from, to = 'u', 'w'
if op == 'downgrade' then
  from, to = 'w', 'u'
end
if hold[2] == 'released' then
  return {-3, 0}
end
if mode == to and redis.call('HGET', KEYS[1], to) == owner then
  return {1, 0}
end
if mode ~= from then
  return {-3, 0}
end
if op == 'upgrade' then
  local ms = nil
  if state[1] and state[1] ~= owner then
    ms = live(state[1], 'w')
  end
  ms = ms or live_reader(owner)
  if ms then
    local reservation = tonumber(ARGV[3])
    if reservation > 0 then
      reserve(owner, reservation)
      mark_waiting(ms)
    end
    return {-7, ms}
  end
  if state[2] then
    unreserve(owner)
  end
end
redis.call('HDEL', KEYS[1], from)
redis.call('HSET', KEYS[1], to, owner)
redis.call('HSET', KEYS[2], 'mode', to)
if op == 'downgrade' then
  redis.call('PUBLISH', base .. 'chan', 'downgraded')
end
return {1, 0}
