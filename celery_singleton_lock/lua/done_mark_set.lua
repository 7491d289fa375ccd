-- Record that an attempt of a task call ended (celery/done_marks.py): sent in the same
-- round trip as the run's release, before it.
-- KEYS[1]: the done mark (P{T}:done:<task id>)
-- ARGV[1]: the attempt that ended (request.retries)
-- ARGV[2]: the mark's expiry in ms
-- The mark keeps the highest attempt that ended; a mark sent again (a lost reply, redis-py's
-- retry) or an earlier attempt's late one never lowers it, and only refreshes its expiry.
-- returns the highest attempt that ended
local ended = tonumber(redis.call('GET', KEYS[1]))
local attempt = tonumber(ARGV[1])
if ended == nil or attempt > ended then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return attempt
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return ended
