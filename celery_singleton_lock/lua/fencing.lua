-- The fencing token of a new holder (prepended, after clock.lua, to every script that makes
-- one): max(last
-- token + 1, server time in µs). Tokens come from the Redis server clock; the counter
-- P{T}:fence covers the two cases the clock alone does not: two tokens in one µs, and a
-- clock stepped back. It expires FENCE_SLACK_MS after the server time its token stands for
-- (PXAT: absolute server time), and Redis expires keys by that same clock: while the clock
-- reads before a token, its counter is there and the next token goes above it; once the
-- counter is gone, the clock reads past the token. So tokens keep increasing across release,
-- expiry, clearing and a clock stepped back by any amount, at ~10 s of a small key per
-- name. A counter lost with its server's data (a restart without persistence, a failover
-- that lost the last writes) leaves it to the clock of the server that answers next; the
-- slack covers that clock reading up to FENCE_SLACK_MS behind the lost one (a replica's
-- skew): docs/fencing.md.
-- One SET ... PXAT ... GET both records the clock's token and reads the last one: a second
-- write is needed only when the counter is not behind the clock.
-- Returns the token as text.
local FENCE_SLACK_MS = 10000
local function next_fencing_token(fence_key)
  local time = server_time()
  local us = time[2]
  if #us < 6 then
    us = string.sub('00000' .. us, -6)
  end
  local token = time[1] .. us
  local gone_ms = string.format('%.0f', (time[1] .. string.sub(us, 1, 3)) + FENCE_SLACK_MS)
  local last = tonumber(redis.call('SET', fence_key, token, 'PXAT', gone_ms, 'GET'))
  if last and last >= tonumber(token) then
    last = last + 1
    token = string.format('%.0f', last)
    gone_ms = string.format('%.0f', math.floor(last / 1000) + FENCE_SLACK_MS)
    redis.call('SET', fence_key, token, 'PXAT', gone_ms)
  end
  return token
end
