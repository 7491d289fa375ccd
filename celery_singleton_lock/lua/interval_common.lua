-- Shared helpers of the interval scripts (reader-writer and range locks); the Python side
-- prepends this file to interval_acquire/release/change/renew.lua before registering them.
--
-- Key layout of one interval lock (rw: B = P{T}:rw:, range: B = P{T}:range:), as KEYS from
-- offset o (o = 0 in acquire/release/change; 8 * (i - 1) for handle i in renew):
--   o+1  B exp    zset  owner -> expiry, ms of server time (every holder, every mode)
--   o+2  B r:lo   zset  owner -> lo of each READ holder       o+3  B r:hi  owner -> hi
--   o+4  B u:lo   zset  UPGRADABLE holders, by lo              o+5  B u:hi  by hi
--   o+6  B w:lo   zset  WRITE holders, by lo                   o+7  B w:hi  by hi
--   o+8  B h:<owner>  hash  the holder record (same fields as a lease's hash + mode, lo, hi)
--   9..11 B q:lo, q:hi, q:exp  zsets: reservations of waiting writers (lo, hi, expiry)
--   12   B waiting  string: a waiter sleeps on this lock (see mark_waiting); acquire,
--        release and change only
--   13   P{T}:fence  the fencing counter shared with the lease of the same name (acquire)
-- A reader-writer lock is an interval lock whose every holder covers [-inf, +inf].
--
-- Overlap query in O(log n): a holder [l, h] misses the closed interval [a, b] exactly when
-- l > b or h < a, and both cannot hold at once, so
--   overlapping = ZCARD(lo) - ZCOUNT(lo, (b, +inf) - ZCOUNT(hi, -inf, (a)
-- Three skiplist rank lookups, whatever the number of holders and however readers overlap.
-- Expired holders are pruned from the indexes at the start of every script (amortised
-- O(log n) each); their hashes expire on their own. Every index key lives at least until the
-- latest expiry it indexes: an acquire or renewal PEXPIREs the keys it writes to the latest
-- expiry of the whole lock; a release only removes entries, so it leaves expiries alone (the
-- keys outlive the released holder by at most what its lease had left, and vanish once empty).
-- So B exp, which every such PEXPIRE sets, runs out only once every entry of every index has
-- expired; but a mode's pair can outlive it (a release left its longer expiry, and a later
-- acquire set B exp to a shorter latest one), still holding the entries of holders that died.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local MODES = {r = 2, u = 4, w = 6}
-- Slack a waiter's mark keeps beyond its wait hint: time for the failed attempt's reply to
-- reach the waiter and its retry to come back.
local MARK_SLACK_MS = 1000
local INDEXES = {1, 2, 3, 4, 5, 6, 7}

local function zrem_all(key, members)
  for i = 1, #members, 1000 do
    redis.call('ZREM', key, unpack(members, i, math.min(i + 999, #members)))
  end
end

-- Drop expired holders (from KEYS o+1..o+7) and expired reservations (q keys, o = 0 only).
local function prune(o, with_queue)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[o + 1], '-inf', now_ms)
  if #gone > 0 then
    for k = o + 2, o + 7 do
      zrem_all(KEYS[k], gone)
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[o + 1], '-inf', now_ms)
  end
  if with_queue then
    gone = redis.call('ZRANGEBYSCORE', KEYS[11], '-inf', now_ms)
    if #gone > 0 then
      zrem_all(KEYS[9], gone)
      zrem_all(KEYS[10], gone)
      redis.call('ZREMRANGEBYSCORE', KEYS[11], '-inf', now_ms)
    end
  end
end

-- How many entries of the (lo, hi) index pair overlap the closed interval [lo, hi].
local function overlapping(lo_key, hi_key, lo, hi)
  local n = redis.call('ZCARD', lo_key)
  if n == 0 then
    return 0
  end
  return n - redis.call('ZCOUNT', lo_key, '(' .. hi, '+inf')
    - redis.call('ZCOUNT', hi_key, '-inf', '(' .. lo)
end

-- PEXPIRE index keys o+k, for k in `which` (default: all of 1..7), to the latest expiry
-- the lock holds.
local function refresh(o, which)
  local last = redis.call('ZRANGE', KEYS[o + 1], -1, -1, 'WITHSCORES')
  if last[2] then
    local ms = math.max(1, tonumber(last[2]) - now_ms)
    for _, k in ipairs(which or INDEXES) do
      redis.call('PEXPIRE', KEYS[o + k], ms)
    end
  end
end

local function refresh_queue()
  local last = redis.call('ZRANGE', KEYS[11], -1, -1, 'WITHSCORES')
  if last[2] then
    local ms = math.max(1, tonumber(last[2]) - now_ms)
    for k = 9, 11 do
      redis.call('PEXPIRE', KEYS[k], ms)
    end
  end
end

-- Ms until the earliest entry of an expiry zset could run out (nil: none).
local function earliest(key)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first[2] then
    return math.max(0, tonumber(first[2]) - now_ms)
  end
  return nil
end

local function remove_holder(owner)
  local m = MODES[redis.call('HGET', KEYS[8], 'mode') or '']
  if m then
    redis.call('ZREM', KEYS[m], owner)
    redis.call('ZREM', KEYS[m + 1], owner)
  else  -- the hash ran out a moment before its index entry: look everywhere
    for k = 2, 7 do
      redis.call('ZREM', KEYS[k], owner)
    end
  end
  redis.call('ZREM', KEYS[1], owner)
  redis.call('DEL', KEYS[8])
end

-- A caller that will wait for this blocked request marks the lock (KEYS[12]) for `ms`, its
-- wait hint, plus slack: a release publishes only while the mark is there (see wake). It
-- sleeps at most its hint before it tries again, and that failed attempt marks it again, so
-- the mark lasts as long as it waits. Never shortened: another waiter may sleep longer.
-- Every waiter makes a failed attempt after its subscription is live, so a release after
-- that attempt finds the mark and reaches it.
local function mark_waiting(ms)
  ms = ms + MARK_SLACK_MS
  if redis.call('PTTL', KEYS[12]) < ms then
    redis.call('SET', KEYS[12], 1, 'PX', ms)
  end
end

-- Wake the lock's waiters if any marked it: take the mark (they all hear this message and
-- try again, and whoever is still blocked marks it anew) and publish.
local function wake(channel, message)
  if redis.call('DEL', KEYS[12]) == 1 then
    redis.call('PUBLISH', channel, message)
  end
end

-- Withdraw owner's reservation; 1 if it had one. Most callers never reserved: one lookup.
local function unreserve(owner)
  if not redis.call('ZSCORE', KEYS[11], owner) then
    return 0
  end
  redis.call('ZREM', KEYS[9], owner)
  redis.call('ZREM', KEYS[10], owner)
  return redis.call('ZREM', KEYS[11], owner)
end

-- Is `mode` on [lo, hi] blocked? `parent`: the upgradable owner a write nests in ('' none).
-- Writers ignore reservations (two waiting writers must not block each other); readers and
-- upgradables respect them, which is what keeps a reader stream from starving a writer.
local function blocked(mode, lo, hi, parent)
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

-- The wait hint of a blocked request: ms until the earliest holder (or reservation, which a
-- reader or upgradable respects) could expire; a lower bound, so waking then is always safe.
local function hint(mode)
  local ms = earliest(KEYS[1])
  if mode ~= 'w' then
    local q = earliest(KEYS[11])
    if q and (not ms or q < ms) then
      ms = q
    end
  end
  return ms or 0
end

-- max(last token + 1, server time in µs), as in acquire.lua: one SET ... GET records the
-- clock's token and reads the last one; a second write only if the counter is not behind.
local function next_token(fence_key, fence_ttl)
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local token = string.format('%.0f', now_us)
  local last = tonumber(redis.call('SET', fence_key, token, 'PX', fence_ttl, 'GET') or '0')
  if last >= now_us then
    token = string.format('%.0f', last + 1)
    redis.call('SET', fence_key, token, 'PX', fence_ttl)
  end
  return token
end
