-- Renew several leases in one call: the heartbeat tick, and Lease.extend with one key.
-- KEYS[i]: lock hash of lease i
-- ARGV[3i-2]: owner token of lease i   ARGV[3i-1]: new lease length of lease i, ms
-- ARGV[3i]: generation of the renewal (the holder's extends raise it)
-- Reply codes: HolderReply in core/replies.py (keep the two in step).
-- returns one integer per lease:
--   > 0  renewed: ms the lease now has (less than asked when its max-hold deadline is near)
--     0  gone: expired (or Redis lost it) and nobody holds the name
--    -1  another owner holds the name, or it is in a release delay (which has no owner: an
--        empty owner token matches nothing, so a late renewal never cuts a delay short)
--    -2  max-hold reached: not renewed, the lease runs out on its own
-- The remaining time is *set*, never added to, so a lease cannot grow without bound.
--
-- Renewals of one holder can race: a heartbeat tick read the old lease length, and an
-- extend sent after it runs first. So a renewal of a generation older than the lease's
-- (stored as `gen` once an extend raised it) leaves it alone and answers the ms it has; one of the same or a newer
-- generation renews. Within one generation the length asked is the same, so no renewal
-- shortens what a later one of that generation set.
local now_ms = server_ms()
local result = {}
for i, key in ipairs(KEYS) do
  local holder = redis.call('HMGET', key, 'owner', 'deadline_ms', 'state', 'gen')
  local gen, stored = tonumber(ARGV[3 * i]), tonumber(holder[4]) or 0
  if not holder[1] then
    result[i] = 0
  elseif holder[1] == '' or holder[3] == 'release_delay' or holder[1] ~= ARGV[3 * i - 2] then
    result[i] = -1
  elseif gen < stored then
    result[i] = math.max(1, redis.call('PTTL', key))
  else
    local lease = tonumber(ARGV[3 * i - 1])
    local deadline = tonumber(holder[2]) or 0
    if deadline > 0 and deadline - now_ms < lease then
      lease = deadline - now_ms
    end
    if lease <= 0 then
      result[i] = -2
    else
      redis.call('PEXPIRE', key, lease)
      redis.call('HSET', key, 'renewed_ms', now_ms, 'ttl_ms', ARGV[3 * i - 1])
      if gen > stored then
        redis.call('HSET', key, 'gen', gen)
      end
      result[i] = lease
    end
  end
end
return result
