-- Prepended to the scripts that read or write keys they do not name in KEYS (a release's
-- trace, the waiters' queues and marks). While the lock's slot migrates between
-- Redis Cluster nodes, Redis refuses a script's command on a key this node does not have (it
-- is, or will be, on the other node), and a command on two keys of which one is missing: the
-- script would end there with an error, after the lock was freed, or without freeing it.
-- Those keys are advisory (a trace lets a release sent again answer released; a queued
-- waiter also hears the release's PUBLISH, a reservation runs out), so advisory(...) runs
-- the command and answers nil where the migration refuses it; any other error is raised.
local function advisory(...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err then
    if string.find(reply.err, 'non local key', 1, true) then
      return nil
    end
    error(reply)
  end
  return reply
end
