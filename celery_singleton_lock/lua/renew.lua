-- Renew several leases in one call: the heartbeat tick, and Lease.extend with one key.
-- KEYS[i]: lock hash of lease i
-- ARGV[3i-2]: owner token of lease i   ARGV[3i-1]: new lease length of lease i, ms
-- ARGV[3i]: generation of the renewal (the holder's extends raise it)
-- Reply codes: Reply in core/replies.py (keep the two in step): ms granted (> 0), GONE 0,
-- TAKEN -1, MAX_HOLD_REACHED -2.
-- returns one integer per lease, renew_hold.lua's code for it
local result = {}
for i, key in ipairs(KEYS) do
  result[i] = renew_hold(key, ARGV[3 * i - 2], ARGV[3 * i - 1], tonumber(ARGV[3 * i]))
end
return result
