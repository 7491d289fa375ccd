-- Take one permit of a counting semaphore: at most `limit` permits of one name at once.
-- A permit is an interval hold in mode 'r' on [-inf, +inf] (see interval_common.lua, which
-- the Python side prepends with fencing.lua and interval_overlap.lua): its entry in B exp
-- and its holder hash B h:<owner>, so the interval release, renewal and admin scripts serve
-- permits unchanged. Permits index nothing else; the cap is the number of B exp entries.
-- KEYS: see interval_common.lua (1..13; KEYS[8] is the new holder's hash)
-- ARGV[1]: owner token    ARGV[2]: limit (int >= 1)    ARGV[3]: lease, ms
-- ARGV[4]: max-hold, ms (0: no cap)
-- ARGV[5]: '1' the caller will wait if blocked ('' it will not)
-- ARGV[6]: the call identity of the new permit ('' none): an opaque string, stored in the
--          holder's hash as `call`; while a permit of the same call identity is held,
--          nothing is granted
-- ARGV[7..]: field, value pairs describing the holder
-- Reply codes: Reply in core/replies.py (keep the two in step): the token
-- alone is DONE; BUSY -7, HELD_BY_CALL -5.
-- returns fencing token        taken, or held by this owner already: a re-sent attempt whose
--                              first run's reply was lost gets the token it has, unchanged; the
--                              token alone (a string), not a table: see acquire_outcome()
--                              in core/replies.py
--         {-7, ms}             `limit` permits are held; ms until the first could run out
--         {-5, ms}             a permit of the call identity ARGV[6] is held (another
--                              delivery of the same call): ms it has left. Nothing granted
--                              or marked: a call never holds two permits
--
-- The limit is the acquiring call's: holders that were let in under a higher limit keep
-- their permits, and a call with a lower one waits until fewer than it are held.
-- A permit in its release delay still counts until the delay ends.
local owner, limit, call = ARGV[1], tonumber(ARGV[2]), ARGV[6]
local latest = 0  -- ms: the latest expiry of the permits already held
if redis.call('EXISTS', KEYS[1]) == 1 then
  overlap_helpers()
  -- Ours already (owner tokens are unique per acquire call): this very attempt sent again.
  local mine = redis.call('HMGET', KEYS[8], 'token', 'state')
  if mine[1] and mine[2] ~= 'release_delay' and redis.call('ZSCORE', KEYS[1], owner) then
    return mine[1]
  end
  latest = tonumber(redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2])
  prune(0, false)
  if call ~= '' then
    -- Before the limit: with a permit free or not, this call must not hold two.
    local ms = call_hold(call, '')
    if ms then
      return {-5, ms}
    end
  end
  if redis.call('ZCARD', KEYS[1]) >= limit then
    local ms = earliest(KEYS[1]) or 0
    if ARGV[5] == '1' then
      mark_waiting(ms)
    end
    return {-7, ms}
  end
end
local token = next_token(KEYS[13])
local lease, deadline = first_lease(ARGV[3], ARGV[4])
local expiry = now_ms + lease
redis.call('ZADD', KEYS[1], expiry, owner)
redis.call('HSET', KEYS[8], 'owner', owner, 'token', token, 'acquired_ms', now_ms,
  'renewed_ms', now_ms, 'ttl_ms', ARGV[3], 'deadline_ms', deadline, 'mode', 'r',
  'lo', '-inf', 'hi', 'inf', 'parent', '', 'limit', limit, unpack(ARGV, 7))
if call ~= '' then
  redis.call('HSET', KEYS[8], 'call', call)
end
redis.call('PEXPIRE', KEYS[8], lease)
redis.call('PEXPIRE', KEYS[1], math.max(latest, expiry) - now_ms)
return token
