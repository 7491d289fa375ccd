-- A freed hold's trace (prepended, after advisory.lua, to the scripts that free holds now):
-- what answers the same release or clear sent again after its reply was lost (redis-py's
-- retry, or the caller's own). It replaces the hold's hash `from` by a small hash `key` (the
-- same key or another one) with only the fields a call sent again reads (the hold's owner or
-- token, its `state`, `cleared`), for the time `from` had left: a new hash, since one
-- trimmed with HDEL keeps the size it had. With no time left, or while its slot migrates
-- and the node refuses a new key (advisory.lua), the hold goes without a trace.
local function leave_trace(from, key, ...)
  local left = redis.call('PTTL', from)
  redis.call('DEL', from)
  if left > 0 and advisory('HSET', key, ...) then
    redis.call('PEXPIRE', key, left)
  end
end
