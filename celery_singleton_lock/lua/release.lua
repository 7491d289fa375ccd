-- Release a lease, now or after a delay during which the name stays locked with no owner.
-- KEYS[1]: lock hash (P{T}:lock)
-- ARGV[1]: owner token   ARGV[2]: delay, ms (0: free now)
-- ARGV[3]: the fencing token of the hold released ('' not known: a claim's release by its
--          owner token, which is unique per claim, not per hold)
-- Reply codes: HolderReply in core/replies.py (keep the two in step).
-- returns 1   released (or handed to the oldest live fair waiter); also for a release sent
--             again after its reply was lost (see below)
--         0   not held: the lease expired and nobody holds the name
--        -1   another owner holds the name (or it is in another holder's release delay)
--
-- A release that frees the name now leaves P{T}:freed, the hold's owner and fencing token
-- for the time the hold had left (trace.lua): what tells the same release sent again after
-- its reply was lost that it was done. That release finds its owner there, and its fencing
-- token when it passes one (fencing tokens are unique per name). The next release that
-- frees the name replaces the trace. A release delay names its owner as `released_by`
-- instead. A multi-key lock's release leaves the same trace (multi_release.lua); the
-- admin's calls that free a lease key leave one with no owner and `cleared` (clear.lua,
-- release_holder.lua): a holder whose lease was cleared must find it lost, not released.
--
-- Only a hash a waiter marked (see acquire.lua) is handed over or published: an uncontended
-- release pays for neither, nor for the keys only a hand-off needs. Those are named here from
-- the lock hash's own name (same hash tag, so the same slot): the fencing counter P{T}:fence,
-- the queue of fair waiters P{T}:queue, a waiter W's registration P{T}:w:W and the list it
-- blocks on, P{T}:m:W; so is the wake-up channel, P{T}:chan. A release with a delay does
-- neither: waiters look again when it ends. A hand-off makes the waiter the holder at once,
-- with its own ttl, max-hold and holder fields, and a fresh fencing token; the waiter's
-- blocked BLPOP returns that token.
local holder = redis.call('HMGET', KEYS[1], 'owner', 'waiting', 'token')
local owner = holder[1]
local base = string.sub(KEYS[1], 1, -5)
local token = ARGV[3] or ''
if owner ~= ARGV[1] then
  if owner == '' and redis.call('HGET', KEYS[1], 'released_by') == ARGV[1] then
    return 1
  end
  local freed = advisory('HMGET', base .. 'freed', 'owner', 'token') or {}
  if freed[1] == ARGV[1] and (token == '' or freed[2] == token) then
    return 1
  end
  if not owner then
    return 0
  end
  return -1
end
local delay = tonumber(ARGV[2])
if delay > 0 then
  redis.call('HSET', KEYS[1], 'owner', '', 'state', 'release_delay', 'released_ms', server_ms(),
    'released_by', ARGV[1])
  redis.call('PEXPIRE', KEYS[1], delay)
  return 1
end
leave_trace(KEYS[1], base .. 'freed', 'owner', ARGV[1], 'token', holder[3])
if not holder[2] then
  return 1
end
local fence = base .. 'fence'
-- A hand-off writes the lock's hash anew, which a slot migrating away from this node refuses
-- (advisory.lua), as it refuses any key this node does not have (the probe: a key nobody
-- writes). Then the name stays free: the fair waiters take it with their own next attempt
-- (within their registration's lifetime), the others on the PUBLISH.
local handing = advisory('EXISTS', base .. 'w:') ~= nil
while handing do
  local next_owner = advisory('LPOP', base .. 'queue')
  if not next_owner then
    break
  end
  local registration = base .. 'w:' .. next_owner
  local fields = redis.call('HGETALL', registration)
  if #fields > 0 then
    redis.call('DEL', registration)
    local wanted = {}
    for i = 1, #fields, 2 do
      wanted[fields[i]] = fields[i + 1]
    end
    local now_ms = server_ms()
    local token = next_fencing_token(fence)
    local lease = tonumber(wanted['ttl_ms'])
    local max_hold = tonumber(wanted['max_hold_ms'])
    local deadline = 0
    if max_hold > 0 then
      deadline = now_ms + max_hold
      lease = math.min(lease, max_hold)
    end
    redis.call('HSET', KEYS[1], unpack(fields))
    redis.call('HDEL', KEYS[1], 'max_hold_ms')
    -- Still marked: the rest of the queue (and any other waiter) waits for this holder.
    redis.call('HSET', KEYS[1], 'owner', next_owner, 'token', token, 'acquired_ms', now_ms,
      'renewed_ms', now_ms, 'deadline_ms', deadline, 'waiting', 1)
    redis.call('PEXPIRE', KEYS[1], lease)
    local handed = base .. 'm:' .. next_owner
    redis.call('RPUSH', handed, token)
    redis.call('PEXPIRE', handed, lease)
    return 1
  end
end
redis.call('PUBLISH', base .. 'chan', 'released')
return 1
