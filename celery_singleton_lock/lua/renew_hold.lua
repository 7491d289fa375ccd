-- Renew a hold (prepended, after clock.lua, to every renew script).
--
-- renew_to(key, ask, deadline, gen, stored): the renewal every kind's hold gets: set hash
-- `key`'s remaining time to `ask` ms (as text), cut to the hold's max-hold `deadline` (server
-- ms; 0: none), and record it (`renewed_ms`, `ttl_ms`, and `gen` when newer than the `stored`
-- one). Returns the ms set, or -2: max-hold reached (not renewed: it runs out on its own).
local function renew_to(key, ask, deadline, gen, stored)
  local now_ms = server_ms()
  local lease = tonumber(ask)
  if deadline > 0 and deadline - now_ms < lease then
    lease = deadline - now_ms
  end
  if lease <= 0 then
    return -2
  end
  redis.call('PEXPIRE', key, lease)
  redis.call('HSET', key, 'renewed_ms', now_ms, 'ttl_ms', ask)
  if gen > stored then
    redis.call('HSET', key, 'gen', gen)
  end
  return lease
end

-- renew_hold(key, owner, ask, gen): renew one lease hash (renew.lua, multi_renew.lua: a
-- lease's and each name of a multi-key lock's hash are the same kind of hold).
-- `key`: the lock hash; `owner`: the owner token it must have; `ask`: the lease length
-- asked, ms (as text); `gen`: the renewal's generation.
-- Returns the reply code of renew.lua (Reply in core/replies.py): > 0 ms the lease now
-- has (less than asked when its max-hold deadline is near), 0 gone, -1 another owner's or in
-- a release delay (which has no owner: an empty owner token matches nothing, so a late
-- renewal never cuts a delay short), -2 max-hold reached (not renewed: it runs out on its
-- own). The remaining time is *set*, never added to, so a lease cannot grow without bound.
--
-- Renewals of one holder can race: a heartbeat tick read the old lease length, and an
-- extend sent after it runs first. So a renewal of a generation older than the lease's
-- (stored as `gen` once an extend raised it) leaves it alone and answers the ms it has; one
-- of the same or a newer generation renews. Within one generation the length asked is the
-- same, so no renewal shortens what a later one of that generation set.
local function renew_hold(key, owner, ask, gen)
  local holder = redis.call('HMGET', key, 'owner', 'deadline_ms', 'state', 'gen', 'undo', 'token')
  local stored = tonumber(holder[4]) or 0
  if not holder[1] then
    return 0
  end
  if holder[1] == '' or holder[3] == 'release_delay' or holder[1] ~= owner then
    return -1
  end
  if holder[5] then
    -- The holder renews, so its acquire's reply arrived: the claim that acquire took over
    -- and kept for its undo (acquire.lua) will not be put back. Gone now, not in minutes.
    advisory('DEL', string.sub(key, 1, -5) .. 'undo:' .. holder[6])
    redis.call('HDEL', key, 'undo')
  end
  if gen < stored then
    return math.max(1, redis.call('PTTL', key))
  end
  return renew_to(key, ask, tonumber(holder[2]) or 0, gen, stored)
end
