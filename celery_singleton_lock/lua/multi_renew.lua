-- Renew several multi-key locks in one call (the heartbeat tick, and extend with one).
-- KEYS: the lock hashes of lock 1, then of lock 2, ... (ARGV says how many each)
-- ARGV[4i-3]: key count of lock i   ARGV[4i-2]: its owner token   ARGV[4i-1]: lease, ms
-- ARGV[4i]: generation of the renewal: one older than a key's `gen` leaves that key alone
--           and counts the ms it has (renew_hold.lua)
-- Reply codes: Reply in core/replies.py (keep the two in step): ms granted (> 0),
-- GONE 0, TAKEN -1, MAX_HOLD_REACHED -2.
-- returns one integer per lock: > 0 ms granted (the least over its keys), 0 some key gone,
-- -1 some key held by another owner or in a release delay (never renewed), -2 max-hold
-- reached. Keys still owned are renewed even when another is lost, so what the holder still
-- has stays consistent until released.
local result = {}
local RANK = {[-1] = 3, [0] = 2, [-2] = 1}
local k = 0
for i = 1, #ARGV / 4 do
  local code = nil
  local gen = tonumber(ARGV[4 * i])
  for _ = 1, tonumber(ARGV[4 * i - 3]) do
    k = k + 1
    local this = renew_hold(KEYS[k], ARGV[4 * i - 2], ARGV[4 * i - 1], gen)
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
