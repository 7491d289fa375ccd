-- Renew several interval holds in one call (the heartbeat tick, and extend with one hold).
-- KEYS[8(i-1)+1 .. 8i]: keys 1..8 of hold i's lock (see interval_common.lua)
-- ARGV[2i-1]: owner token of hold i   ARGV[2i]: new lease length of hold i, ms
-- returns one integer per hold: > 0 ms granted, 0 gone (or released: a hold in delay-after
-- is never renewed, so a renewal sent before a delayed release cannot cut the delay short),
-- -2 max-hold reached
-- The remaining time is *set*, never added to.
local result = {}
now()
for i = 1, #KEYS / 8 do
  local o = 8 * (i - 1)
  local owner = ARGV[2 * i - 1]
  local expiry = tonumber(redis.call('ZSCORE', KEYS[o + 1], owner))
  local holder = redis.call('HMGET', KEYS[o + 8], 'deadline_ms', 'state')
  if not expiry or expiry <= now_ms then
    prune(o, false)
    result[i] = 0
  elseif holder[2] == 'cooldown' then
    result[i] = 0
  else
    local lease = tonumber(ARGV[2 * i])
    local deadline = tonumber(holder[1]) or 0
    if deadline > 0 and deadline - now_ms < lease then
      lease = deadline - now_ms
    end
    if lease <= 0 then
      result[i] = -2
    else
      redis.call('ZADD', KEYS[o + 1], now_ms + lease, owner)
      redis.call('PEXPIRE', KEYS[o + 8], lease)
      redis.call('HSET', KEYS[o + 8], 'renewed_ms', now_ms, 'ttl_ms', ARGV[2 * i])
      refresh(o)
      result[i] = lease
    end
  end
end
return result
