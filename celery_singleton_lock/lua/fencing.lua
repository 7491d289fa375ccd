-- The fencing token of a new holder (prepended by scripts.py to every script that makes one):
-- max(last token + 1, server time in µs), so tokens keep increasing across release, expiry,
-- clearing and loss of the counter P{T}:fence, using the Redis server clock only: a counter
-- lost with a failover still leaves the new master's clock ahead of the tokens it had given.
-- One SET ... PX ... GET both records the clock's token, with the counter's expiry, and reads
-- the last one: a second write is needed only when the counter is not behind the clock (a
-- clock stepped back, or the same µs). The expiry is set again by every token, so the
-- counter outlives a name's last token by ttl_ms: a server clock stepped back by less than
-- that never gives a lower token, and a name used once costs its counter's memory for that
-- long only (it is the one key a released name leaves for long).
-- `time`: the server's TIME reply (seconds, microseconds). Returns the token as text.
local function next_fencing_token(fence_key, time, ttl_ms)
  local us = time[2]
  if #us < 6 then
    us = string.sub('00000' .. us, -6)
  end
  local token = time[1] .. us
  local last = tonumber(redis.call('SET', fence_key, token, 'PX', ttl_ms, 'GET'))
  if last and last >= tonumber(token) then
    token = string.format('%.0f', last + 1)
    redis.call('SET', fence_key, token, 'PX', ttl_ms)
  end
  return token
end
