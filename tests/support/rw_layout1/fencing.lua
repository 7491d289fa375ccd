-- The fencing token of a new holder (prepended by scripts.py to every script that makes one):
-- max(last token + 1, server time in µs), so tokens keep increasing across release, expiry,
-- clearing and loss of the counter P{T}:fence, using the Redis server clock only: a counter
-- lost with a failover still leaves the new master's clock ahead of the tokens it had given.
-- One SET ... GET both records the clock's token and reads the last one: a second write is
-- needed only when the counter is not behind the clock (a clock stepped back, or the same
-- µs). KEEPTTL: the counter's ttl is set when the counter is made, not on every token (an
-- expiry written on every acquire costs more than the SET itself); it then runs out
-- FENCE_TTL after it was made, however busy the name, and is made again from the clock.
-- A counter below CLOCK_FLOOR_US never came from the clock (written by hand): it gets the
-- ttl too.
-- `time`: the server's TIME reply (seconds, microseconds). Returns the token as text.
local CLOCK_FLOOR_US = 1000000000000000
local function next_fencing_token(fence_key, time, ttl_ms)
  local us = time[2]
  if #us < 6 then
    us = string.sub('00000' .. us, -6)
  end
  local token = time[1] .. us
  local last = redis.call('SET', fence_key, token, 'GET', 'KEEPTTL')
  if not last then
    redis.call('PEXPIRE', fence_key, ttl_ms)
    return token
  end
  last = tonumber(last)
  if last < CLOCK_FLOOR_US then
    redis.call('PEXPIRE', fence_key, ttl_ms)
  end
  if last >= tonumber(token) then
    token = string.format('%.0f', last + 1)
    redis.call('SET', fence_key, token, 'KEEPTTL')
  end
  return token
end
