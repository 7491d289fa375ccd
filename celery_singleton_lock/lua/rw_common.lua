-- Shared helpers of the reader-writer scripts (rw_acquire/release/change/renew.lua): the
-- Python side prepends this file (and fencing.lua) to each before registering it.
--
-- Key layout of one reader-writer lock (B = P{T}:rw:):
--   B exp        hash  the lock: `w` the owner of the write hold (an upgraded hold too), `u`
--                the owner of the upgradable hold, `r:<owner>` one field per read hold
--                (its value `1`, or `=` and the hold's call identity when it has one),
--                `q` server ms until which a waiting writer's reservation may hold new
--                readers back (the latest of B wq). Its expiry is at least the latest of its
--                holds' and reservations'.
--   B h:<owner>  hash  one hold: owner, token, acquired_ms, ttl_ms, mode (r|u|w), holder (the
--                packed holder fields); call (its call identity) when it has one;
--                deadline_ms with a max-hold, renewed_ms once
--                renewed, gen, state and released_ms in a release delay. Its own expiry is
--                the hold's lease: a hold is held exactly while its hash exists (and is named
--                by B exp), so a crashed reader frees its share within its lease. Released
--                by its holder (or cleared: also `cleared=1`), it gives way until that
--                expiry to its trace (trace.lua), `state=released` and its token, which
--                answers the release (or clear) sent again (rw_release.lua); B exp no longer
--                names it, and renewals, changes, and listings pass it by.
--   B wq         zset  owner -> expiry (server ms) of each waiting writer's reservation
--   B waiting    string: a waiter sleeps on this lock; releases publish only while it is
--                there. B exp's field `waiting` says a waiter marked it (a release takes both)
--   B chan       the pub/sub channel woken by releases, withdrawals and downgrades
--   P{T}:fence   the fencing counter shared with the lease of the same name
-- KEYS[1] is B exp and KEYS[2] the caller's B h:<owner>; the other keys share their hash tag
-- (one slot) and are named here from B.
--
-- A field of B exp whose hold's hash is gone (expired, crashed holder) is stale: whoever
-- meets it while deciding drops it. An uncontended acquire (no B exp) decides nothing.
-- Every helper is made by helpers(), only by a call that needs one: each function defined
-- costs every call a closure, and the uncontended acquire and release need none.
local base, now_ms
local now, live, live_reader, call_hold, requeue, reserve, mark_waiting, keep, wake, unreserve
-- Slack a waiter's mark keeps beyond its wait hint: time for the failed attempt's reply to
-- reach the waiter and its retry to come back.
local MARK_SLACK_MS = 1000

local function helpers()
  if now then
    return
  end
  base = string.sub(KEYS[1], 1, -4)

  -- Server time, ms (clock.lua), kept in now_ms once read.
  now = function()
    now_ms = server_ms()
    return now_ms
  end

  -- The remaining ms of `owner`'s hold (> 0), or nil once its hash is gone (then `field`
  -- of B exp is dropped).
  live = function(owner, field)
    local ms = redis.call('PTTL', base .. 'h:' .. owner)
    if ms == -2 then
      redis.call('HDEL', KEYS[1], field)
      return nil
    end
    return math.max(ms, 1)
  end

  -- The first answer other than nil of `visit(owner, field, value)` over the read holds'
  -- fields of B exp (HSCAN pages of 100), or nil.
  local function first_reader(visit)
    local cursor = '0'
    repeat
      local page = redis.call('HSCAN', KEYS[1], cursor, 'MATCH', 'r:*', 'COUNT', 100)
      cursor = page[1]
      local fields = page[2]
      for i = 1, #fields, 2 do
        local ms = visit(string.sub(fields[i], 3), fields[i], fields[i + 1])
        if ms then
          return ms
        end
      end
    until cursor == '0'
    return nil
  end

  -- The remaining ms of some live read hold (other than `except`), or nil if there is
  -- none; read holds met dead on the way are dropped. Stops at the first live one, so a
  -- blocked writer pays for the dead, each once, and one live reader.
  live_reader = function(except)
    return first_reader(function(owner, field)
      if owner ~= except then
        return live(owner, field)
      end
    end)
  end

  -- The remaining ms of a running hold of call identity `call` (> 0), or nil if none: the
  -- writer `w` and the upgradable `u` (their owners as read, nil if none) by their hashes'
  -- `call`, the readers by their fields' values (no hash read per reader but a match's).
  -- A hold in its release delay is no running hold: its call ended (a retry of it, or a
  -- late copy that a done mark drops, may go in). Read holds met dead on the way are
  -- dropped. Costs a caller that gives a call identity one HSCAN page per 100 read holds,
  -- only on a lock someone holds.
  call_hold = function(call, w, u)
    local function running(owner, field)
      if redis.call('HGET', base .. 'h:' .. owner, 'state') == 'release_delay' then
        return nil
      end
      return live(owner, field)
    end
    for _, held in ipairs({{'w', w}, {'u', u}}) do
      local owner = held[2]
      if owner and redis.call('HGET', base .. 'h:' .. owner, 'call') == call then
        local ms = running(owner, held[1])
        if ms then
          return ms
        end
      end
    end
    local value = '=' .. call
    return first_reader(function(owner, field, stored)
      if stored == value then
        return running(owner, field)
      end
    end)
  end

  -- Drop expired reservations and set `q` to the latest left (none: no `q`). Returns the
  -- ms until the earliest left could run out, nil if none.
  requeue = function()
    local queue = base .. 'wq'
    -- Refused while the slot migrates (advisory.lua): `q` stays as it is, as a hint.
    if not advisory('ZREMRANGEBYSCORE', queue, '-inf', now()) then
      return nil
    end
    local last = redis.call('ZRANGE', queue, -1, -1, 'WITHSCORES')
    if not last[2] then
      redis.call('HDEL', KEYS[1], 'q')
      return nil
    end
    redis.call('HSET', KEYS[1], 'q', last[2])
    local first = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
    return math.max(1, tonumber(first[2]) - now_ms)
  end

  -- Queue (or renew) owner's reservation for `ms`: new readers and upgradables wait.
  reserve = function(owner, ms)
    local queue = base .. 'wq'
    local expiry = now() + ms
    redis.call('ZADD', queue, expiry, owner)
    if redis.call('PTTL', queue) < ms then
      redis.call('PEXPIRE', queue, ms)
    end
    local q = tonumber(redis.call('HGET', KEYS[1], 'q'))
    if not q or q < expiry then
      redis.call('HSET', KEYS[1], 'q', expiry)
    end
    keep(ms)
  end

  -- A caller that will wait marks the lock for `ms`, its wait hint, plus slack: a release
  -- publishes only while the mark is there. Never shortened: another waiter may sleep
  -- longer. (As the interval engine's mark_waiting.)
  mark_waiting = function(ms)
    ms = ms + MARK_SLACK_MS
    local mark = base .. 'waiting'
    if redis.call('PTTL', mark) < ms then
      redis.call('SET', mark, 1, 'PX', ms)
    end
    -- Also in B exp, where a release deleting its own field learns of it for free.
    redis.call('HSET', KEYS[1], 'waiting', 1)
  end

  -- B exp lives at least `ms` more.
  keep = function(ms)
    if redis.call('PTTL', KEYS[1]) < ms then
      redis.call('PEXPIRE', KEYS[1], ms)
    end
  end

  -- Wake the lock's waiters if any marked it: take the mark (they all hear this message
  -- and try again, and whoever is still blocked marks it anew) and publish.
  -- A mark the migration of the slot keeps from this node (advisory.lua): publish anyway.
  wake = function(message)
    if advisory('DEL', base .. 'waiting') ~= 0 then
      redis.call('PUBLISH', base .. 'chan', message)
    end
  end

  -- Withdraw owner's reservation; true if it had one.
  unreserve = function(owner)
    -- A reservation the migration keeps from this node runs out on its own (advisory.lua).
    if (advisory('ZREM', base .. 'wq', owner) or 0) == 0 then
      return false
    end
    requeue()
    return true
  end
end
