-- Hand a held lease over to a new owner token without freeing the name in between: a task
-- that retries hands its lock to the retry message, which takes it over when it runs.
-- KEYS[1]: lock hash
-- ARGV[1]: current owner token   ARGV[2]: new owner token   ARGV[3]: new expiry, ms
-- ARGV[4..]: field, value pairs to set on the holder
-- Reply codes: Reply in core/replies.py (keep the two in step): DONE 1, GONE 0,
-- TAKEN -1.
-- returns 1 handed over (also when sent again after its reply was lost: the name is held
--           by the new owner token already); 0 not held (expired, nobody holds it);
--         -1 held by another owner
local owner = redis.call('HGET', KEYS[1], 'owner')
if not owner then
  return 0
end
if owner == ARGV[2] then
  return 1
end
if owner ~= ARGV[1] then
  return -1
end
redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'deadline_ms', 0, 'ttl_ms', ARGV[3], unpack(ARGV, 4))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
