-- Helpers of the interval scripts that decide on overlaps (acquire, change, renew); the
-- Python side prepends interval_common.lua and then this file to them. The release decides
-- nothing on overlaps and goes without: every helper defined costs each call a closure.
-- For the same reason they are made only by a call that needs them, overlap_helpers():
-- an acquire of a lock with no key at all (the uncontended case) decides nothing either.
local zrem_all, prune_queue, prune, overlapping, earliest, mark_waiting, blocked, hint
local call_hold
-- Slack a waiter's mark keeps beyond its wait hint: time for the failed attempt's reply to
-- reach the waiter and its retry to come back.
local MARK_SLACK_MS = 1000

local function overlap_helpers()
  zrem_all = function(key, members)
    for i = 1, #members, 1000 do
      redis.call('ZREM', key, unpack(members, i, math.min(i + 999, #members)))
    end
  end

  -- Drop expired reservations (q keys).
  prune_queue = function()
    local gone = redis.call('ZRANGEBYSCORE', KEYS[11], '-inf', now())
    if #gone > 0 then
      zrem_all(KEYS[9], gone)
      zrem_all(KEYS[10], gone)
      redis.call('ZREMRANGEBYSCORE', KEYS[11], '-inf', now_ms)
    end
  end

  -- Drop expired holders (from KEYS o+1..o+7) and expired reservations (q keys, o = 0 only).
  prune = function(o, with_queue)
    local gone = redis.call('ZRANGEBYSCORE', KEYS[o + 1], '-inf', now())
    if #gone > 0 then
      for k = o + 2, o + 7 do
        zrem_all(KEYS[k], gone)
      end
      redis.call('ZREMRANGEBYSCORE', KEYS[o + 1], '-inf', now_ms)
    end
    if with_queue then
      prune_queue()
    end
  end

  -- How many entries of the (lo, hi) index pair overlap the closed interval [lo, hi].
  overlapping = function(lo_key, hi_key, lo, hi)
    local n = redis.call('ZCARD', lo_key)
    if n == 0 then
      return 0
    end
    return n - redis.call('ZCOUNT', lo_key, '(' .. hi, '+inf')
      - redis.call('ZCOUNT', hi_key, '-inf', '(' .. lo)
  end

  -- Ms until the earliest entry of an expiry zset could run out (nil: none).
  earliest = function(key)
    now()
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    if first[2] then
      return math.max(0, tonumber(first[2]) - now_ms)
    end
    return nil
  end

  -- A caller that will wait for this blocked request marks the lock (KEYS[12]) for `ms`, its
  -- wait hint, plus slack: a release publishes only while the mark is there (see wake). It
  -- sleeps at most its hint before it tries again, and that failed attempt marks it again, so
  -- the mark lasts as long as it waits. Never shortened: another waiter may sleep longer.
  -- Every waiter makes a failed attempt after its subscription is live, so a release after
  -- that attempt finds the mark and reaches it.
  mark_waiting = function(ms)
    ms = ms + MARK_SLACK_MS
    if redis.call('PTTL', KEYS[12]) < ms then
      redis.call('SET', KEYS[12], 1, 'PX', ms)
    end
  end

  -- Is `mode` on [lo, hi] blocked? `parent`: the upgradable owner a write nests in ('' none).
  -- Writers ignore reservations (two waiting writers must not block each other); readers and
  -- upgradables respect them, which is what keeps a reader stream from starving a writer.
  blocked = function(mode, lo, hi, parent)
    if mode == 'r' then
      return overlapping(KEYS[6], KEYS[7], lo, hi) > 0 or overlapping(KEYS[9], KEYS[10], lo, hi) > 0
    end
    if overlapping(KEYS[6], KEYS[7], lo, hi) > 0 then
      return true
    end
    local own = 0
    if parent ~= '' then
      own = 1
    end
    if overlapping(KEYS[4], KEYS[5], lo, hi) > own then
      return true
    end
    if mode == 'u' then
      return overlapping(KEYS[9], KEYS[10], lo, hi) > 0
    end
    return overlapping(KEYS[2], KEYS[3], lo, hi) > 0
  end

  -- The ms left of a running hold of call identity `call` on this lock (> 0), other than
  -- owner `except`'s (a nested write's parent), or nil if none. After prune(): every holder
  -- in B exp is live. A hold in its release delay is no running hold: its call ended (a
  -- retry of it, or a late copy that a done mark drops, may go in). Reads each holder's
  -- hash (its `call`): O(n) in the holders, paid only by a caller that gives a call
  -- identity, on a lock someone holds (a semaphore: about its limit).
  call_hold = function(call, except)
    local base = string.sub(KEYS[1], 1, -4)  -- B exp -> B
    now()
    local held = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
    for i = 1, #held, 2 do
      local owner = held[i]
      if owner ~= except then
        local hold = redis.call('HMGET', base .. 'h:' .. owner, 'call', 'state')
        if hold[1] == call and hold[2] ~= 'release_delay' then
          return math.max(1, tonumber(held[i + 1]) - now_ms)
        end
      end
    end
    return nil
  end

  -- The wait hint of a blocked request: ms until the earliest holder (or reservation, which a
  -- reader or upgradable respects) could expire; a lower bound, so waking then is always safe.
  hint = function(mode)
    local ms = earliest(KEYS[1])
    if mode ~= 'w' then
      local q = earliest(KEYS[11])
      if q and (not ms or q < ms) then
        ms = q
      end
    end
    return ms or 0
  end
end

-- The new holder's fencing token, as a lease's (fencing.lua).
local function next_token(fence_key)
  now()  -- now_ms, which the acquire writes
  return next_fencing_token(fence_key)
end
