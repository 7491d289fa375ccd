-- Renew several multi-key locks in one call (the heartbeat tick, and extend with one).
-- KEYS: the lock hashes of lock 1, then of lock 2, ... (ARGV says how many each)
-- ARGV[4i-3]: key count of lock i   ARGV[4i-2]: its owner token   ARGV[4i-1]: lease, ms
-- ARGV[4i]: generation of the renewal: one older than a key's `gen` leaves that key alone
--           and counts the ms it has (see renew.lua)
-- Reply codes: HolderReply in core/replies.py (keep the two in step).
-- returns one integer per lock: > 0 ms granted (the least over its keys), 0 some key gone,
-- -1 some key held by another owner or in a release delay (never renewed), -2 max-hold reached. Keys still owned are renewed
-- even when another is lost, so what the holder still has stays consistent until released.
local now_ms = server_ms()
local result = {}
local RANK = {[-1] = 3, [0] = 2, [-2] = 1}
local k = 0
for i = 1, #ARGV / 4 do
  local code = nil
  local gen = tonumber(ARGV[4 * i])
  for _ = 1, tonumber(ARGV[4 * i - 3]) do
    k = k + 1
    local holder = redis.call('HMGET', KEYS[k], 'owner', 'deadline_ms', 'state', 'gen')
    local this
    local stored = tonumber(holder[4]) or 0
    if not holder[1] then
      this = 0
    elseif holder[1] == '' or holder[3] == 'release_delay' or holder[1] ~= ARGV[4 * i - 2] then
      this = -1
    elseif gen < stored then
      this = math.max(1, redis.call('PTTL', KEYS[k]))
    else
      local lease = tonumber(ARGV[4 * i - 1])
      local deadline = tonumber(holder[2]) or 0
      if deadline > 0 and deadline - now_ms < lease then
        lease = deadline - now_ms
      end
      if lease <= 0 then
        this = -2
      else
        redis.call('PEXPIRE', KEYS[k], lease)
        redis.call('HSET', KEYS[k], 'renewed_ms', now_ms, 'ttl_ms', ARGV[4 * i - 1])
        if gen > stored then
          redis.call('HSET', KEYS[k], 'gen', gen)
        end
        this = lease
      end
    end
    -- The worst key decides: taken, then gone, then max-hold; else the shortest grant.
    if code == nil then
      code = this
    else
      local worse, was = RANK[this] or 0, RANK[code] or 0
      if worse > was or (worse == 0 and was == 0 and this < code) then
        code = this
      end
    end
  end
  result[i] = code
end
return result
