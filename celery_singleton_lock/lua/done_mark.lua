-- A task call's done mark (celery/done_marks.py): the highest attempt (request.retries) of a
-- task id that ended. Run joined to the lease's own scripts (core/scripts.py `joined`): the
-- read after each acquire attempt, the write before the release, in the same call.
-- KEYS[1]: the done mark (P{T}:done:<task id>)
-- ARGV[1]: '' to read it; else the attempt that ended, to record it (sent in the same round
--          trip as the run's release, before it)
-- ARGV[2]: when recording, the mark's expiry in ms
-- The mark keeps the highest attempt that ended: a mark sent again (a lost reply, redis-py's
-- retry) or an earlier attempt's late one never lowers it, and only refreshes its expiry.
-- returns the highest attempt of the task id that ended (after recording), -1 if none did
local ended = tonumber(redis.call('GET', KEYS[1]))
if ARGV[1] == '' then
  return ended or -1
end
local attempt = tonumber(ARGV[1])
if ended == nil or attempt > ended then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return attempt
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return ended
