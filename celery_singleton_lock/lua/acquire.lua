-- Take an exclusive lease on a name if nobody holds it (nor keeps it in a release delay).
-- KEYS[1]: lock hash          KEYS[2]: fencing counter
-- KEYS[3]: queue of fair waiters (list)   KEYS[4], KEYS[5]: this caller's registration hash
--          and hand-off list (KEYS[3..5] only with ARGV[5] = 'fair')
-- ARGV[1]: owner token (unique per acquisition)
-- ARGV[2]: lease length, ms   ARGV[3]: max-hold, ms (0: no cap)
-- ARGV[4]: owner token of a claim this acquisition may take over ('' for none): a lock held
--          on behalf of a queued message (enqueue-time lock, retry) passes to the worker
--          that runs that message, and to no other
-- ARGV[5]: '' a single try; '1' the caller will wait for a release; 'fair' it will wait in
--          the queue, to be handed the lease by a release (release.lua); 'free' a single try
--          that first releases another lease KEYS[3] held by owner ARGV[6] (a claim the run
--          no longer needs), as release.lua with no delay would; 'free-or-stop' the same, but
--          when another owner holds KEYS[3] it stops there (returns {-7, 0, -1})
-- ARGV[6]: registration lifetime of a fair waiter, ms (it refreshes it while it waits); for
--          'free' and 'free-or-stop': the owner token of the lease KEYS[3] to release
-- ARGV[7]: the field, value pairs describing the holder (host, pid, thread, ...), as one
--          MessagePack array of strings: the caller packs them once per process and thread
--          rather than sending a dozen arguments on every attempt; stored as they come, in
--          the one field `holder`, which the listing decodes (core/holder.py) and
--          release.lua unpacks for a supervisor
-- ARGV[8]: the acquire call's own id, stored as `attempt` with what it takes ('' none): for
--          an owner token that is not unique per acquire call (a claim's), it tells what
--          this call took from what that owner held already (acquire_undo.lua)
-- Reply codes: Reply in core/replies.py (keep the two in step): the token alone
-- is DONE; BUSY -7; KEYS[3]'s release: DONE 1, GONE 0, TAKEN -1.
-- returns fencing token           taken, or held by this owner already: a re-sent attempt
--                                 whose first run's reply was lost (or, for a fair waiter,
--                                 handed to it meanwhile) gets the token it has, unchanged;
--                                 the token alone (a string), not a table: see
--                                 acquire_outcome() in core/replies.py
--         {-7, remaining ms}      held by another; when a waiter should look again at the latest
--         with 'free' and 'free-or-stop', a table in every case, {1, token, freed} when taken,
--         whose third item is what releasing KEYS[3] did, as release.lua's codes (1 released,
--         0 not held, -1 held by another owner)
--
-- A caller that will wait marks the holder's hash (`waiting`), so that only a release of a
-- marked hash pays for a PUBLISH (or a hand-off). Every waiter makes a failed attempt after
-- its subscription is live, so the holder it then waits for is marked; a new holder starts
-- unmarked and is marked by the next failed attempt. A claim taken over keeps the mark.
--
-- A fair waiter also queues its owner token once and keeps a registration (its ttl, max-hold
-- and holder fields) that expires unless refreshed by its next attempt: a waiter that died
-- is skipped by the release instead of being handed the lease.
--
-- The fencing token is the name's counter plus one: see fencing.lua.
--
-- The hash a holder gets: owner, token, acquired_ms, ttl_ms, holder; deadline_ms
-- only with a max-hold; renewed_ms once renewed (until then it is acquired_ms); `waiting`,
-- `attempt`, `gen`, `state` as below and in release.lua and renew.lua.
--
-- A claim taken over is not deleted but renamed to P{T}:undo:<new token>, keeping its own
-- expiry: if the reply of this attempt is lost, acquire_undo.lua puts the claim back, so an
-- attempt that failed never frees a queued message's claim. The new hold's `undo` field says
-- it is kept: the hold's first renewal or its release deletes it (renew_hold.lua,
-- release.lua), as the holder's reply has come by then.
--
-- The release of KEYS[3] comes first and stands whatever the acquire does. Its keys are
-- another name's (another hash tag): not for a Redis Cluster. A release.lua of a marked
-- hash hands it to a fair waiter or publishes; no fair waiter queues for a claim, so here
-- a marked hash only publishes.
local freed = nil
if ARGV[5] == 'free' or ARGV[5] == 'free-or-stop' then
  local claim = redis.call('HMGET', KEYS[3], 'owner', 'waiting')
  if not claim[1] then
    freed = 0
  elseif claim[1] ~= ARGV[6] then
    freed = -1
    if ARGV[5] == 'free-or-stop' then
      return {-7, 0, -1}
    end
  else
    redis.call('DEL', KEYS[3])
    freed = 1
    if claim[2] then
      redis.call('PUBLISH', string.sub(KEYS[3], 1, -5) .. 'chan', 'released')
    end
  end
end
-- A free name (the usual case) costs one read: the owner, not the key's PTTL (a read
-- is cheaper than taking the owner field with HSETNX and writing the rest after it).
local owner = redis.call('HGET', KEYS[1], 'owner')
local remaining = -2
local waiting = nil
if owner then
  remaining = redis.call('PTTL', KEYS[1])
  if owner == ARGV[1] then
    -- Ours already: this very attempt sent again after its reply was lost (redis-py's
    -- retry), a fair waiter handed the lease while it was not listening, or a claim this
    -- fixed owner token holds.
    if ARGV[5] == 'fair' then
      redis.call('DEL', KEYS[4], KEYS[5])
    end
    local token = redis.call('HGET', KEYS[1], 'token')
    if freed == nil then
      return token
    end
    return {1, token, freed}
  end
  if ARGV[4] == '' or owner ~= ARGV[4] then
    if ARGV[5] == 'fair' then
      if redis.call('EXISTS', KEYS[4]) == 0 then
        redis.call('RPUSH', KEYS[3], ARGV[1])
        redis.call('HSET', KEYS[4], 'ttl_ms', ARGV[2], 'max_hold_ms', ARGV[3], 'holder', ARGV[7])
      end
      redis.call('PEXPIRE', KEYS[4], ARGV[6])
      redis.call('PEXPIRE', KEYS[3], ARGV[6])
    end
    if ARGV[5] == '1' or ARGV[5] == 'fair' then
      redis.call('HSET', KEYS[1], 'waiting', 1)
    end
    return {-7, remaining, freed}
  end
  waiting = redis.call('HGET', KEYS[1], 'waiting')
end
local now_ms = server_ms()
local token = next_fencing_token(KEYS[2])
if owner then
  -- A claim taken over: kept aside (see above); this hold starts a hash of its own. While
  -- the slot migrates, the node may refuse the new key (advisory.lua): the take-over is
  -- tried again, as a call whose keys are split between the nodes is, rather than done
  -- without its undo.
  if not advisory('RENAME', KEYS[1], string.sub(KEYS[1], 1, -5) .. 'undo:' .. token) then
    return redis.error_reply('TRYAGAIN a claim cannot be kept aside while its slot migrates')
  end
end
local lease, deadline = first_lease(ARGV[2], ARGV[3])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', token, 'acquired_ms', now_ms,
  'ttl_ms', ARGV[2], 'holder', ARGV[7])
if deadline > 0 then
  redis.call('HSET', KEYS[1], 'deadline_ms', deadline)
end
if waiting then
  redis.call('HSET', KEYS[1], 'waiting', waiting)
end
if owner then
  redis.call('HSET', KEYS[1], 'undo', 1)
end
if ARGV[8] and ARGV[8] ~= '' then
  redis.call('HSET', KEYS[1], 'attempt', ARGV[8])
end
redis.call('PEXPIRE', KEYS[1], lease)
if ARGV[5] == 'fair' and redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('LREM', KEYS[3], 0, ARGV[1])
  redis.call('DEL', KEYS[4])
end
if freed == nil then
  return token
end
return {1, token, freed}
