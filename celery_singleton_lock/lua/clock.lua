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
