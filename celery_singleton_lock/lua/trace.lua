-- A freed hold's trace (prepended, after advisory.lua, to the scripts that free holds now):
-- what answers the same release or clear sent again after its reply was lost (redis-py's
-- retry, or the caller's own). It replaces the hold's hash `from` by a small hash `key` (the
-- same key or another one) with only the fields a call sent again reads (the hold's owner or
-- token, its `state`, `cleared`), for the time `from` had left: a new hash, since one
-- trimmed with HDEL keeps the size it had. With no time left, or while its slot migrates
-- and the node refuses a new key (advisory.lua), the hold goes without a trace.
--
-- freed_reply(state, cleared, held_token, clear, token): what an interval or reader-writer
-- hold's release or clear (`clear`: a clear, the admin's or a supervisor's; `token`: the
-- fencing token it must find, '' any) answers when the hold's hash (its `state`, `cleared`,
-- `token`) says it was freed already; nil when it was not. A trace (`state=released`) answers
-- a call like the one that freed it (the holder's own release, or a clear of its token:
-- `cleared`) released, being that call sent again, and any other gone; a hold in its release
-- delay answers whatever its holder sends (that release again, or one without a delay)
-- released, and the delay ends where it was set to.
local function freed_reply(state, cleared, held_token, clear, token)
  if state == 'released' then
    if clear == (cleared == '1') and (token == '' or token == held_token) then
      return 1
    end
    return 0
  end
  if state == 'release_delay' and not clear then
    return 1
  end
end
local function leave_trace(from, key, ...)
  local left = redis.call('PTTL', from)
  redis.call('DEL', from)
  if left > 0 and advisory('HSET', key, ...) then
    redis.call('PEXPIRE', key, left)
  end
end
