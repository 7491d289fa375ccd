-- Release a hold (now, or after a delay during which its interval stays locked with no
-- renewal), withdraw a waiter's reservation, or clear a holder for the admin tools.
-- KEYS: see interval_common.lua (1..12; KEYS[8] is the holder's hash)
-- ARGV[1]: owner token   ARGV[2]: delay, ms (0: free now)   ARGV[3]: wake-up channel
-- ARGV[4]: fencing token the holder must have ('' : any)
-- ARGV[5]: renewed_ms the holder must still have ('' : any): the admin's clear of a hold it
--          listed stale leaves it alone once its heartbeat resumed
-- ARGV[6]: '1' for a clear (the admin's, or a supervisor's release of a dead task's hold),
--          '' for the holder's own release: the holder of a hold cleared finds it lost
-- Reply codes: Reply in core/replies.py (keep the two in step): DONE 1, GONE 0,
-- TAKEN -1, RESUMED -6.
-- returns 1   released (or, for a waiter, its reservation withdrawn); also for a call sent
--             again after its reply was lost: a release or clear that freed the hold left in
--             its hash's place a trace (trace.lua), `state=released` with the hold's token
--             (`cleared=1` if a clear freed it), for the time the hold had left, and one that
--             began a release delay left `state=release_delay`, whose end it does not move; so
--             does the holder's release of a hold in its delay, with a delay or without
--         0   not held: the hold expired (or was cleared, or, for a clear, released)
--        -1   the holder's fencing token is not ARGV[4]
--        -6   the holder was renewed since it was listed (renewed_ms is not ARGV[5])
--
-- It decides nothing on overlaps, so it does not prune: a holder still holds while its hash
-- and its B exp entry are there (see interval_common.lua), and removing its own entries
-- only ever frees. Waiters are woken only if one marked the lock (see mark_waiting).
local owner = ARGV[1]
local delay = tonumber(ARGV[2])
local token, renewed, clear = ARGV[4], ARGV[5] or '', ARGV[6] == '1'
local holder = redis.call('HMGET', KEYS[8], 'mode', 'token', 'renewed_ms', 'hi', 'state',
  'cleared')
local freed = freed_reply(holder[5], holder[6], holder[2], clear, token)
if freed then
  return freed  -- freed already, and named by no index (trace.lua)
end
local m = MODES[holder[1] or '']
local woke = false
-- Only a waiting writer or upgrade queues a reservation, never the owner of a read hold.
if holder[1] ~= 'r' and unreserve(owner) > 0 then
  woke = true
end
-- A plain release learns whether it held from its ZREM below; the others ask first.
if m and (clear or delay > 0) and not redis.call('ZSCORE', KEYS[1], owner) then
  m = nil  -- pruned as expired a moment before its hash ran out
end
local result = 0
if m then
  if token ~= '' and holder[2] ~= token then
    return -1
  end
  -- A hold not renewed yet has no renewed_ms: its acquired_ms stands for it.
  local last = holder[3]
  if renewed ~= '' and not last then
    last = redis.call('HGET', KEYS[8], 'acquired_ms')
  end
  if renewed ~= '' and tonumber(last) ~= tonumber(renewed) then
    return -6
  end
  if delay > 0 then
    -- Release delay: keep the indexed interval until the delay ends; nothing renews it now.
    -- A hold in its delay already is this very release sent again (a supervisor's: its
    -- holder's was answered above): the delay's end stays.
    if holder[5] ~= 'release_delay' then
      redis.call('ZADD', KEYS[1], now() + delay, owner)
      redis.call('HSET', KEYS[8], 'state', 'release_delay', 'released_ms', now_ms)
      redis.call('PEXPIRE', KEYS[8], delay)
      refresh(0)
    end
    result = 1
  elseif redis.call('ZREM', KEYS[1], owner) == 1 then
    redis.call('ZREM', KEYS[m], owner)
    -- A hold up to +inf (every reader-writer hold) has no entry in its mode's hi index; its
    -- hash's hi is the hold's, kept in step by a shrink (see interval_common.lua).
    if tonumber(holder[4]) ~= math.huge then
      redis.call('ZREM', KEYS[m + 1], owner)
    end
    -- Its hash gives way to the trace that answers this call sent again, for the time
    -- the hold had left; a clear's says so, and its holder's own release then finds the
    -- hold gone (lost), not released.
    if clear then
      leave_trace(KEYS[8], KEYS[8], 'state', 'released', 'token', holder[2], 'cleared', 1)
    else
      leave_trace(KEYS[8], KEYS[8], 'state', 'released', 'token', holder[2])
    end
    result = 1
    woke = true
  end
end
if woke then
  wake(ARGV[3], 'released')
  return 1
end
return result
