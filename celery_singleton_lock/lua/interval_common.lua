-- Shared helpers of the interval scripts (range locks, semaphores); the Python side
-- prepends this file to interval_acquire/release/change/renew.lua before registering them
-- (and interval_overlap.lua after it, to all but the release).
--
-- Key layout of one interval lock (range: B = P{T}:range:), as KEYS from
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
--
-- Overlap query in O(log n): a holder [l, h] misses the closed interval [a, b] exactly when
-- l > b or h < a, and both cannot hold at once, so
--   overlapping = ZCARD(lo) - ZCOUNT(lo, (b, +inf) - ZCOUNT(hi, -inf, (a)
-- Three skiplist rank lookups, whatever the number of holders and however readers overlap.
-- A holder whose hi is +inf never counts in ZCOUNT(hi, -inf, (a), so it has no entry in its
-- mode's hi index (every hold of a reader-writer lock): its hi is +inf where that entry is
-- missing, and its hash says so too.
-- Expired holders are pruned from the indexes at the start of every script that decides on
-- overlaps (acquire, change, renew; amortised O(log n) each); their hashes expire on their
-- own. Every index key lives at least until the latest expiry it indexes: an acquire or
-- renewal PEXPIREs the keys it writes to the latest expiry of the whole lock; a release only
-- removes entries, so it leaves expiries alone (the keys outlive the released holder by at
-- most what its lease had left, and vanish once empty). So B exp, which every such PEXPIRE
-- sets, runs out only once every entry of every index has expired; but a mode's pair can
-- outlive it (a release left its longer expiry, and a later acquire set B exp to a shorter
-- latest one), still holding the entries of holders that died.
--
-- A holder's entries are in B exp and in its mode's pair, and its hash lives as long as its
-- B exp entry (both are set together). A holder whose hash and B exp entry are both there
-- still holds, even a moment past its expiry: an acquire that could conflict with it prunes
-- that entry first. So the release needs no prune and no clock. A hold its holder released
-- (or a clear freed: also `cleared=1`) leaves in its hash's place a trace (trace.lua),
-- `state=released` and its token, for the time the hold had left: what answers that
-- release (or clear) sent again (interval_release.lua). No index names it, so nothing that goes by
-- B exp meets it; listings pass it by.
local now_ms
-- Server time, ms (clock.lua), kept in now_ms once read.
local function now()
  now_ms = server_ms()
  return now_ms
end
local MODES = {r = 2, u = 4, w = 6}

-- PEXPIRE index keys o+k, for k in `which` (default: all of 1..7), to the latest expiry
-- the lock holds.
local function refresh(o, which)
  now()
  local last = redis.call('ZRANGE', KEYS[o + 1], -1, -1, 'WITHSCORES')
  if last[2] then
    local ms = math.max(1, tonumber(last[2]) - now_ms)
    if which then
      for _, k in ipairs(which) do
        redis.call('PEXPIRE', KEYS[o + k], ms)
      end
    else
      for k = 1, 7 do
        redis.call('PEXPIRE', KEYS[o + k], ms)
      end
    end
  end
end

local function refresh_queue()
  now()
  local last = redis.call('ZRANGE', KEYS[11], -1, -1, 'WITHSCORES')
  if last[2] then
    local ms = math.max(1, tonumber(last[2]) - now_ms)
    for k = 9, 11 do
      redis.call('PEXPIRE', KEYS[k], ms)
    end
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
