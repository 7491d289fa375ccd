-- The Redis server's clock, the only clock a script reads (never a client's; prepended to
-- every script that needs the time): TIME read once per script call, and only by a call
-- that asks. server_time() is TIME's reply ({seconds, microseconds}, as text), server_ms()
-- the milliseconds as a number.
local server_t, server_now_ms
local function server_time()
  if not server_t then
    server_t = redis.call('TIME')
  end
  return server_t
end
local function server_ms()
  if not server_now_ms then
    local t = server_time()
    server_now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return server_now_ms
end
-- first_lease(ttl, max_hold): a new hold's first lease, ms, no longer than its max-hold, and
-- its max-hold deadline (server ms; 0: none), for `ttl` and `max_hold` ms (0: no cap).
local function first_lease(ttl, max_hold)
  ttl, max_hold = tonumber(ttl), tonumber(max_hold)
  if max_hold > 0 then
    return math.min(ttl, max_hold), server_ms() + max_hold
  end
  return ttl, 0
end
