-- The fencing token of a new holder (prepended by scripts.py to every script that makes one):
-- max(last token + 1, server time in µs), so tokens keep increasing across expiry, clearing
-- and loss of the counter, using the Redis server clock only. One SET ... GET both records
-- the clock's token and reads the last one: a second write is needed only when the counter
-- is not behind the clock (a clock stepped back, or the same µs).
local function next_fencing_token(fence_key, now_us, ttl_ms)
  local token = string.format('%.0f', now_us)
  local last = tonumber(redis.call('SET', fence_key, token, 'PX', ttl_ms, 'GET') or '0')
  if last >= now_us then
    token = string.format('%.0f', last + 1)
    redis.call('SET', fence_key, token, 'PX', ttl_ms)
  end
  return token
end
