-- Release a hold (now, or after a delay during which it stays held with no renewal),
-- withdraw a waiting writer's reservation, or clear a hold for the admin tools.
-- KEYS[1]: B exp   KEYS[2]: B h:<owner> (see rw_common.lua)
-- ARGV[1]: owner token   ARGV[2]: delay, ms (0: free now)
-- ARGV[3]: fencing token the hold must have ('' : any)
-- ARGV[4]: renewed_ms the hold must still have ('' : any): the admin's clear of a hold it
--          listed stale leaves it alone once its heartbeat resumed
-- ARGV[5]: the hold's mode as its holder knows it (r|u|w), for a plain release (no delay,
--          nothing checked): it then goes without reading the hold's hash
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
--        -1   the hold's fencing token is not ARGV[3]
--        -6   the hold was renewed since it was listed (renewed_ms is not ARGV[4])
-- Waiters are woken only if one marked the lock (see mark_waiting).
local owner = ARGV[1]
local delay = tonumber(ARGV[2])
local token, renewed, mode = ARGV[3] or '', ARGV[4] or '', ARGV[5] or ''
local clear = ARGV[6] == '1'
local holder = nil
if delay == 0 and not clear and token == '' and renewed == '' and (mode == 'r' or mode == 'w')
then
  -- The holder's own release: the hash is named by its owner, so finding it is the owner
  -- check. Its field goes (while the hash was there no other hold could have it; the
  -- `waiting` field goes with it and says whether a waiter marked the lock), and the hash
  -- gives way to the trace of this release: `state=released`, for the time the hold had
  -- left, so that this release sent again answers released. Nothing reads it as
  -- a hold: the lock hash no longer names it, renewals and changes refuse that state.
  local mine = redis.call('HMGET', KEYS[2], 'token', 'state', 'cleared')
  if mine[2] == 'released' then
    -- Freed already: by this release (sent again), or by a clear (the hold was lost).
    if mine[3] then
      return 0
    end
    return 1
  end
  if mine[2] == 'release_delay' then
    -- Released already, with a delay: the delay ends where it was set to.
    return 1
  end
  if mine[1] then
    local field = mode
    if mode == 'r' then
      field = 'r:' .. owner
    end
    local marked = redis.call('HDEL', KEYS[1], field, 'waiting') == 2
    leave_trace(KEYS[2], KEYS[2], 'state', 'released', 'token', mine[1])
    if marked then
      helpers()
      wake('released')
    end
    return 1
  end
  mode = nil
else
  holder = redis.call('HMGET', KEYS[2], 'mode', 'token', 'renewed_ms', 'acquired_ms', 'state',
    'cleared')
  mode = holder[1]
  local freed = freed_reply(holder[5], holder[6], holder[2], clear, token)
  if freed then
    return freed  -- freed already (trace.lua)
  end
end
helpers()
local woke = 0
-- A hold gone, or an upgradable one: a writer or an upgrade that stopped waiting withdraws
-- its reservation.
if not mode or mode == 'u' then
  if redis.call('HEXISTS', KEYS[1], 'q') == 1 and unreserve(owner) then
    woke = 1
  end
  if not mode then
    if woke == 1 then
      wake('released')
    end
    return woke
  end
end
if token ~= '' and holder[2] ~= token then
  return -1
end
-- A hold not renewed yet has no renewed_ms: its acquired_ms stands for it.
if renewed ~= '' and tonumber(holder[3] or holder[4]) ~= tonumber(renewed) then
  return -6
end
local field = mode
if mode == 'r' then
  field = 'r:' .. owner
end
if delay > 0 then
  -- Release delay: the hold stays in B exp until its hash runs out; nothing renews it now.
  -- A hold in its delay already is this very release sent again (a supervisor's: its
  -- holder's was answered above): the delay's end stays.
  if holder[5] ~= 'release_delay' then
    redis.call('HEXISTS', KEYS[1], field)  -- a hash, as above
    redis.call('HSET', KEYS[2], 'state', 'release_delay', 'released_ms', now())
    redis.call('PEXPIRE', KEYS[2], delay)
    keep(delay)
  end
  if woke == 1 then
    wake('released')
  end
  return 1
end
local marked = redis.call('HDEL', KEYS[1], field, 'waiting') == 2
-- A trace, as above; a clear's says so, and its holder's own release then finds the hold
-- gone (lost), not released.
if not clear then
  leave_trace(KEYS[2], KEYS[2], 'state', 'released', 'token', holder[2])
else
  leave_trace(KEYS[2], KEYS[2], 'state', 'released', 'token', holder[2], 'cleared', 1)
end
if marked or woke == 1 then
  wake('released')
end
return 1
