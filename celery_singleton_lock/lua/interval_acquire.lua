-- Take a read ('r'), upgradable ('u') or write ('w') hold on the closed interval [lo, hi].
-- KEYS: see interval_common.lua (1..13; KEYS[8] is the new holder's hash)
-- ARGV[1]: owner token    ARGV[2]: mode r|u|w    ARGV[3], ARGV[4]: lo, hi (strtod syntax)
-- ARGV[5]: lease, ms      ARGV[6]: max-hold, ms (0: no cap)
-- ARGV[7]: reservation, ms: a blocked writer that will wait queues one (0: do not; only
--          write requests queue)
-- ARGV[8]: owner of the upgradable hold a write nests in ('' none)
-- ARGV[9]: publish channel    ARGV[10]: '1' the caller will wait if blocked ('' it will not)
-- ARGV[11]: the field, value pairs describing the holder, packed as a lease's are
--           (acquire.lua's ARGV[7]), stored as they come in the one field `holder`
-- ARGV[12]: the call identity of the new hold ('' none): an opaque string, stored in the
--           holder's hash as `call`; while a hold of the same call identity stands on the
--           lock (any mode, any interval; not the parent), nothing is granted
--
-- The holder's hash (as a lease's): owner, token, acquired_ms, ttl_ms, mode, lo,
-- hi, holder; deadline_ms only with a max-hold, parent only for a write nested in an
-- upgradable hold, call only with a call identity, renewed_ms once renewed.
-- Reply codes: Reply in core/replies.py (keep the two in step): the token
-- alone is DONE; BUSY -7, PARENT_GONE -3, HELD_BY_CALL -5.
-- returns fencing token         taken, or held by this owner already: a re-sent attempt whose
--                               first run's reply was lost gets the token it has, unchanged; the
--                               token alone (a string), not a table: see acquire_outcome()
--                               in core/replies.py
--         {-7, ms}               blocked; ms until a conflicting holder could run out
--         {-3, 0}                the parent upgradable hold is gone or does not cover [lo, hi]
--         {-5, ms}               a hold of the call identity ARGV[12] stands (another delivery
--                                of the same call): ms it has left. Nothing granted, queued
--                                or marked: a call is never let in beside itself
--
-- A lock with no key at all (no holder, no reservation, not even an expired one: the common
-- uncontended case) takes one EXISTS to know it: nothing to prune, nothing to overlap, and
-- the new hold's expiry is the lock's latest.
local owner, mode, lo, hi = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local parent = ARGV[8]
local call = ARGV[12] or ''
local latest = 0  -- ms: the latest expiry of the holders already there
if parent ~= '' or redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6],
    KEYS[7], KEYS[11]) > 0 then
  overlap_helpers()
  -- Ours already (owner tokens are unique per acquire call): this very attempt sent again.
  local mine = redis.call('HMGET', KEYS[8], 'token', 'state')
  if mine[1] and mine[2] ~= 'release_delay' and redis.call('ZSCORE', KEYS[1], owner) then
    return mine[1]
  end
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if last[2] then
    latest = tonumber(last[2])
    prune(0, true)
  else
    -- B exp ran out, so any entry left in a holder index is of a hold that expired (see
    -- interval_common.lua), and nothing else could prune it.
    redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
    prune_queue()
  end
  if call ~= '' then
    -- Before the conflicts: whatever else holds, this call must not hold twice.
    local ms = call_hold(call, parent)
    if ms then
      return {-5, ms}
    end
  end
  if parent ~= '' then
    local plo = redis.call('ZSCORE', KEYS[4], parent)
    local phi = redis.call('ZSCORE', KEYS[5], parent) or 'inf'
    if not plo or tonumber(plo) > tonumber(lo) or tonumber(phi) < tonumber(hi) then
      return {-3, 0}
    end
  end
  if blocked(mode, lo, hi, parent) then
    local reserve = tonumber(ARGV[7])
    if reserve > 0 and mode == 'w' then
      redis.call('ZADD', KEYS[9], lo, owner)
      redis.call('ZADD', KEYS[10], hi, owner)
      redis.call('ZADD', KEYS[11], now() + reserve, owner)
      refresh_queue()
    end
    local ms = hint(mode)
    if ARGV[10] == '1' then
      mark_waiting(ms)
    end
    return {-7, ms}
  end
  -- Only a write request queues a reservation (a read's or upgradable's owner never has one).
  if mode == 'w' and unreserve(owner) > 0 then
    refresh_queue()
  end
end
local token = next_token(KEYS[13])
local lease, deadline = first_lease(ARGV[5], ARGV[6])
local m = MODES[mode]
local expiry = now_ms + lease
redis.call('ZADD', KEYS[1], expiry, owner)
redis.call('ZADD', KEYS[m], lo, owner)
local with_hi = tonumber(hi) ~= math.huge  -- see interval_common.lua
if with_hi then
  redis.call('ZADD', KEYS[m + 1], hi, owner)
end
redis.call('HSET', KEYS[8], 'owner', owner, 'token', token, 'acquired_ms', now_ms,
  'ttl_ms', ARGV[5], 'mode', mode, 'lo', lo, 'hi', hi, 'holder', ARGV[11])
if call ~= '' then
  redis.call('HSET', KEYS[8], 'call', call)
end
if deadline > 0 then
  redis.call('HSET', KEYS[8], 'deadline_ms', deadline)
end
if parent ~= '' then
  redis.call('HSET', KEYS[8], 'parent', parent)
end
redis.call('PEXPIRE', KEYS[8], lease)
-- The keys written to live until the lock's latest expiry (as refresh(0, {1, m, m + 1}),
-- without reading it again: the prune removed only entries already run out).
local ms = math.max(latest, expiry) - now_ms
redis.call('PEXPIRE', KEYS[1], ms)
redis.call('PEXPIRE', KEYS[m], ms)
if with_hi then
  redis.call('PEXPIRE', KEYS[m + 1], ms)
end
return token
