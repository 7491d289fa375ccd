-- Free a lease, now or after a delay during which the name stays locked with no owner: its
-- holder's release, the admin's clear of a listed holder, or a supervisor's release of what a
-- task's process held (ARGV[4] says which).
-- KEYS[1]: lock hash (P{T}:lock)
-- ARGV[1]: the holder's release: its owner token ('' for the others)
-- ARGV[2]: delay, ms (0: free now; a clear frees now)
-- ARGV[3]: the fencing token of the hold freed ('' not known: a claim's release by its owner
--          token, which is unique per claim, not per hold; a supervisor's); a clear's is the
--          token listed (of the holder, or of the release delay it left behind)
-- ARGV[4]: '' (or none) the holder's release; 'clear' the admin's clear of the holder listed
--          with ARGV[3]; 'holder' a supervisor's release of the hold of task ARGV[6] in
--          process ARGV[7] on host ARGV[8] (a worker child killed by a hard time limit,
--          revoked with terminate, or lost: it knows no owner token)
-- ARGV[5]: a clear: the holder's renewed_ms when it was listed stale ('' not checked: a
--          forced clear, or a release delay). A hold not renewed yet has no renewed_ms: its
--          acquired_ms stands for it (acquire.lua)
-- ARGV[9]: a supervisor's: how the process's mark (`proc`, core/pid_evidence.py) begins
--          ('' not known): its boot and namespaces and their ':' (pids are reused across
--          containers and within one), or the whole mark. A hold with a `proc` that does not
--          begin so is another process's
-- Reply codes: Reply in core/replies.py (keep the two in step): DONE 1, GONE 0,
-- TAKEN -1; a clear's also RESUMED -6.
-- returns 1   released or cleared (a holder's release: or handed to the oldest live fair
--             waiter); also for a call sent again after its reply was lost (see below)
--         0   not held: the lease expired and nobody holds the name (a clear: released or
--             expired since it was listed; a supervisor's: not held by that task in that
--             process on that host)
--        -1   another owner holds the name (or it is in another holder's release delay); a
--             clear: another holder (another fencing token) has it now: left alone
--        -6   a clear: renewed since it was listed stale (its heartbeat resumed): left alone
--
-- A call that frees the name now leaves P{T}:freed, for the time the hold had left
-- (trace.lua): the holder's release its `owner` and fencing `token`, the others the token and
-- `cleared`, who freed it: 'clear' (the admin), 'holder <task id> <pid> <host>[ <proc>]' (a
-- supervisor). That is what tells the same call sent again after its reply was lost that it
-- was done (it finds itself there, and its fencing token when it passes one: tokens are unique
-- per name), and a holder whose lease was cleared that it lost it, not released it. The next
-- call that frees the name replaces the trace. A release delay names who released it as
-- `released_by` instead. A multi-key lock's release leaves the holder's trace
-- (multi_release.lua).
--
-- A supervisor finds the task id, pid, host and proc in the hold's packed `holder` field
-- (acquire.lua), or as fields of their own, which win (a hand-over writes them:
-- handover.lua). It never frees a claim (owner 'claim:...', see celery/claims.py: 'claim:' is
-- CLAIM_OWNER_PREFIX of kinds/lease.py, which a script cannot import): that was handed over for
-- the task's next attempt and still carries the task id and pid of the run that handed it over.
--
-- Only a hash a waiter marked (see acquire.lua) is handed over or published: an uncontended
-- release pays for neither, nor for the keys only a hand-off needs. Those are named here from
-- the lock hash's own name (same hash tag, so the same slot): the fencing counter P{T}:fence,
-- the queue of fair waiters P{T}:queue, a waiter W's registration P{T}:w:W and the list it
-- blocks on, P{T}:m:W; so is the wake-up channel, P{T}:chan. A release with a delay does
-- neither: waiters look again when it ends. The holder's release hands the name to the oldest
-- live fair waiter, making it the holder at once, with its own ttl, max-hold and holder fields,
-- and a fresh fencing token, which its blocked BLPOP returns. A clear or a supervisor's release
-- publishes, and wakes that waiter to take the freed name itself (wake_fair_waiter.lua).
local mode, who, token = ARGV[4] or '', ARGV[1], ARGV[3] or ''
local holder = redis.call('HMGET', KEYS[1], 'owner', 'waiting', 'token', 'undo')
local owner = holder[1]
local base = string.sub(KEYS[1], 1, -5)
local found = owner == who
if mode == 'clear' then
  who, found = 'clear', holder[3] == token
elseif mode == 'holder' then
  who = 'holder ' .. ARGV[6] .. ' ' .. ARGV[7] .. ' ' .. ARGV[8]
  if ARGV[9] ~= '' then
    who = who .. ' ' .. ARGV[9]
  end
  found = owner and owner ~= '' and string.sub(owner, 1, 6) ~= 'claim:'
  if found then
    local mine = redis.call('HMGET', KEYS[1], 'task_id', 'pid', 'host', 'proc', 'holder')
    local packed, fields = mine[5] and cmsgpack.unpack(mine[5]) or {}, {}
    for i = 1, #packed - 1, 2 do
      fields[packed[i]] = packed[i + 1]
    end
    -- A field of its own wins, as in the listing; a hold without a proc is not checked on it.
    local proc = mine[4] or fields['proc'] or ARGV[9]
    found = (mine[1] or fields['task_id']) == ARGV[6] and (mine[2] or fields['pid']) == ARGV[7]
      and (mine[3] or fields['host']) == ARGV[8] and string.sub(proc, 1, #ARGV[9]) == ARGV[9]
  end
end
-- The trace's field that names who freed the hold.
local mark = mode == '' and 'owner' or 'cleared'
if not found then
  if owner == '' and mode ~= 'clear' and redis.call('HGET', KEYS[1], 'released_by') == who then
    return 1
  end
  local freed = advisory('HMGET', base .. 'freed', mark, 'token') or {}
  if freed[1] == who and (freed[2] == token or token == '' and mode ~= 'clear') then
    return 1
  end
  if mode == 'holder' or not holder[mode == '' and 1 or 3] then
    return 0
  end
  return -1
end
if mode == 'clear' and (ARGV[5] or '') ~= '' then
  local renewed = redis.call('HMGET', KEYS[1], 'renewed_ms', 'acquired_ms')
  if tonumber(renewed[1] or renewed[2]) ~= tonumber(ARGV[5]) then
    return -6
  end
end
if holder[4] then
  -- The claim this hold took over, kept for its acquire's undo (acquire.lua): not needed.
  advisory('DEL', base .. 'undo:' .. holder[3])
  redis.call('HDEL', KEYS[1], 'undo')
end
local delay = tonumber(ARGV[2])
if delay > 0 then
  redis.call('HSET', KEYS[1], 'owner', '', 'state', 'release_delay', 'released_ms', server_ms(),
    'released_by', who)
  redis.call('PEXPIRE', KEYS[1], delay)
  return 1
end
leave_trace(KEYS[1], base .. 'freed', mark, who, 'token', holder[3])
if not holder[2] then
  return 1
end
if mode ~= '' then
  redis.call('PUBLISH', base .. 'chan', mode == 'clear' and 'cleared' or 'released')
  wake_fair_waiter(base)
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
    local lease, deadline = first_lease(wanted['ttl_ms'], wanted['max_hold_ms'])
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
