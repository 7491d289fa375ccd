-- Release a lock on behalf of a holder process that can no longer do it itself (a worker
-- child killed by a hard time limit, revoked with terminate, or lost): the worker's main
-- process knows the task id and the child's pid, not the owner token.
-- KEYS[1]: lock hash
-- ARGV[1]: task id   ARGV[2]: pid   ARGV[3]: delay, ms (0: free now)   ARGV[4]: wake-up channel
-- returns 1 released; 0 the lock is not held by that task in that process
local holder = redis.call('HMGET', KEYS[1], 'owner', 'task_id', 'pid')
if not holder[1] or holder[1] == '' or holder[2] ~= ARGV[1] or holder[3] ~= ARGV[2] then
  return 0
end
if tonumber(ARGV[3]) > 0 then
  redis.call('HSET', KEYS[1], 'owner', '', 'state', 'cooldown')
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
else
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[4], 'released')
end
return 1
