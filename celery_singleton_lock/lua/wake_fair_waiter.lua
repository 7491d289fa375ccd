-- Prepended to the scripts that free a name without handing it on (release.lua's clear and
-- supervisor's release, multi_release.lua), so that a fair waiter does not sleep through it.
--
-- wake_fair_waiter(base): push 0 (never a fencing token) to the hand-off list P{T}:m:W of
-- the oldest live waiter in P{T}:queue (registered in P{T}:w:W; see release.lua), for as
-- long as its registration lasts: it wakes and takes the freed name with its own attempt.
-- Waiters whose registration ran out (they died) are dropped from the queue on the way.
local function wake_fair_waiter(base)
  for _, waiter in ipairs(advisory('LRANGE', base .. 'queue', 0, -1) or {}) do
    local lifetime = redis.call('PTTL', base .. 'w:' .. waiter)
    if lifetime > 0 then
      redis.call('RPUSH', base .. 'm:' .. waiter, 0)
      redis.call('PEXPIRE', base .. 'm:' .. waiter, lifetime)
      return
    end
    redis.call('LREM', base .. 'queue', 1, waiter)
  end
end
