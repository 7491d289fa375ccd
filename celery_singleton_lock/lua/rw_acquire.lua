-- Take a read ('r'), upgradable ('u') or write ('w') hold of a reader-writer lock.
-- KEYS[1]: B exp, the lock hash   KEYS[2]: B h:<owner>, the new hold's hash
-- KEYS[3]: P{T}:fence (see rw_common.lua)
-- ARGV[1]: owner token    ARGV[2]: mode r|u|w    ARGV[3]: lease, ms
-- ARGV[4]: max-hold, ms (0: no cap)
-- ARGV[5]: reservation, ms: a blocked writer that will wait queues one (0: do not)
-- ARGV[6]: '1' the caller will wait if blocked ('' it will not)
-- ARGV[7]: the field, value pairs describing the holder, packed as a lease's are
--          (acquire.lua's ARGV[7]), stored as they come in the one field `holder`
-- ARGV[8]: the call identity of the new hold ('' none): an opaque string; while a hold of
--          the same call identity stands on the lock (in any mode), nothing is granted
-- Reply codes: Reply in core/replies.py (keep the two in step): the token alone
-- is DONE; BUSY -7, HELD_BY_CALL -5.
-- returns fencing token        taken, or held by this owner already: a re-sent attempt whose
--                              first run's reply was lost gets the token it has, unchanged; the
--                              token alone (a string), not a table: see acquire_outcome()
--                              in core/replies.py
--         {-7, ms}             blocked; ms until a conflicting hold could run out
--         {-5, ms}             a hold of the call identity ARGV[8] stands (another delivery
--                              of the same call): ms it has left. Nothing granted, queued
--                              or marked: a call is never let in beside itself
--
-- Read is compatible with read and upgradable; upgradable with read (one at a time); write
-- with nothing. Writers ignore reservations (two waiting writers must not block each
-- other); readers and upgradables respect them, which keeps a reader stream from starving
-- a writer. A free lock (no B exp: the uncontended case) costs one PTTL to know it.
local owner, mode, call = ARGV[1], ARGV[2], ARGV[8] or ''
local field = mode
if mode == 'r' then
  field = 'r:' .. owner
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl ~= -2 then
  local state = redis.call('HMGET', KEYS[1], 'w', 'u', 'q', field)
  if state[4] and (mode == 'r' or state[4] == owner) then
    -- Ours already (owner tokens are unique per acquire call): this very attempt sent again.
    local mine = redis.call('HMGET', KEYS[2], 'token', 'state')
    if mine[1] and mine[2] ~= 'release_delay' then
      return mine[1]
    end
  end
  helpers()
  if call ~= '' then
    -- Before the conflicts: whatever else holds, this call must not hold twice.
    local ms = call_hold(call, state[1], state[2])
    if ms then
      return {-5, ms}
    end
  end
  now()
  local hint = nil
  local function block(ms)
    if ms and (not hint or ms < hint) then
      hint = ms
    end
  end
  if state[1] then
    block(live(state[1], 'w'))
  end
  if state[2] and mode ~= 'r' then
    block(live(state[2], 'u'))
  end
  if state[3] and mode ~= 'w' then
    block(requeue())
  end
  if not hint and mode == 'w' then
    block(live_reader(nil))
  end
  if hint then
    if mode == 'w' and tonumber(ARGV[5]) > 0 then
      reserve(owner, tonumber(ARGV[5]))
    end
    if ARGV[6] == '1' then
      mark_waiting(hint)
    end
    return {-7, hint}
  end
  if mode == 'w' and state[3] then
    unreserve(owner)
  end
  pttl = nil  -- B exp may have gone with the stale fields dropped: read it again
end
local token = next_fencing_token(KEYS[3])
local acquired = server_ms()
local lease, deadline = first_lease(ARGV[3], ARGV[4])
if mode ~= 'r' then
  redis.call('HSET', KEYS[1], field, owner)
elseif call == '' then
  redis.call('HSET', KEYS[1], field, 1)
else
  -- The reader's call identity in its field, where call_hold() finds it.
  redis.call('HSET', KEYS[1], field, '=' .. call)
end
if call == '' then
  redis.call('HSET', KEYS[2], 'owner', owner, 'token', token, 'acquired_ms', acquired,
    'ttl_ms', ARGV[3], 'mode', mode, 'holder', ARGV[7])
else
  redis.call('HSET', KEYS[2], 'owner', owner, 'token', token, 'acquired_ms', acquired,
    'ttl_ms', ARGV[3], 'mode', mode, 'holder', ARGV[7], 'call', call)
end
if deadline > 0 then
  redis.call('HSET', KEYS[2], 'deadline_ms', deadline)
end
redis.call('PEXPIRE', KEYS[2], lease)
-- B exp lives at least as long as this hold.
if (pttl or redis.call('PTTL', KEYS[1])) < lease then
  redis.call('PEXPIRE', KEYS[1], lease)
end
return token
