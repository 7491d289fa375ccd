-- Take several exclusive leases all or nothing (a multi-key lock).
-- KEYS[1..n]: the lock hashes of the names (the very keys a lease on each name uses)
-- KEYS[n+1..2n]: their fencing counters
-- ARGV[1]: owner token   ARGV[2]: lease, ms   ARGV[3]: max-hold, ms (0: no cap)
-- ARGV[4]: '1' if the caller will wait for a release, else ''
-- ARGV[5..4+n]: the names (stored as each hash's `name`)
-- ARGV[5+n..]: field, value pairs describing the holder (kind, host, pid, ...)
-- Reply codes: Reply in core/replies.py (keep the two in step): DONE 1, BUSY -7.
-- returns {1, token 1, ..., token n}   all taken, one fencing token per name; or all held by
--                                       this owner already (a re-sent attempt whose first
--                                       run's reply was lost): the tokens they have
--         {-7, ms}                      some name is held: ms until the first busy one could
--                                       run out (-1: a busy one has no expiry); nothing taken
-- One script over every key makes it atomic, so two multi-locks over overlapping names can
-- never each hold part of what the other needs: no deadlock, no ordering rule.
local n = #KEYS / 2
local hint = nil
local mine, owned = {1}, 0
for i = 1, n do
  local remaining = redis.call('PTTL', KEYS[i])
  local holder = remaining ~= -2 and redis.call('HMGET', KEYS[i], 'owner', 'token')
  if holder and holder[1] == ARGV[1] then
    mine[i + 1] = holder[2]
    owned = owned + 1
  elseif remaining ~= -2 then
    if hint == nil or hint < 0 or (remaining >= 0 and remaining < hint) then
      hint = remaining
    end
    if ARGV[4] == '1' then
      redis.call('HSET', KEYS[i], 'waiting', 1)
    end
  end
end
if hint ~= nil then
  return {-7, hint}
end
if owned == n then
  return mine
end
local now_ms = server_ms()
local lease, deadline = first_lease(ARGV[2], ARGV[3])
local result = {1}
for i = 1, n do
  local token = next_fencing_token(KEYS[n + i])
  redis.call('HSET', KEYS[i], 'owner', ARGV[1], 'token', token, 'acquired_ms', now_ms,
    'renewed_ms', now_ms, 'ttl_ms', ARGV[2], 'deadline_ms', deadline, 'name', ARGV[4 + i],
    'names', n, unpack(ARGV, 5 + n))
  redis.call('PEXPIRE', KEYS[i], lease)
  result[i + 1] = token
end
return result
