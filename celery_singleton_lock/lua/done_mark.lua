-- A task call's done mark (celery/done_marks.py): per send of a task id (celery/sends.py), the
-- highest attempt (request.retries) that ended. Run joined to the lease's own scripts
-- (core/scripts.py `joined`): the read after each acquire attempt, the write before the
-- release, in the same call.
-- KEYS[1]: the done mark (P{T}:done:<task id>), a hash: send id -> highest attempt ended
-- ARGV[1]: '' to read it; else the attempt that ended, to record it (sent in the same round
--          trip as the run's release, before it)
-- ARGV[2]: when recording, the mark's expiry in ms
-- ARGV[3]: the send id ('' for a message that carries none: read, it stands for every send
--          of the task id, as any of them may be its original)
-- ARGV[4]: this delivery's id ('' none): a read notes it (field `?<id>`, value -1, with the
--          expiry ARGV[2]), so that the delivery that holds the lock learns, as it ends, that
--          another delivery of the task id (a copy) tried meanwhile; its write drops it
-- ARGV[5]: when recording: '1' record whatever the notes say (a copy of this message can
--          come later: celery/done_marks.py copies_can_come), '' only if another delivery
--          noted itself (else nothing is left: the key goes with the last note)
-- A send's entry keeps the highest attempt that ended: a mark sent again (a lost reply,
-- redis-py's retry) or an earlier attempt's late one never lowers it, only refreshes the expiry.
-- returns the highest attempt of the send that ended (after recording), -1 if none did
local send = ARGV[3]
local note = nil
if ARGV[4] and ARGV[4] ~= '' then
  note = '?' .. ARGV[4]
end
if ARGV[1] == '' then
  if note then
    redis.call('HSET', KEYS[1], note, -1)
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  if send ~= '' then
    return tonumber(redis.call('HGET', KEYS[1], send)) or -1
  end
  local highest = -1
  for _, ended in ipairs(redis.call('HVALS', KEYS[1])) do
    highest = math.max(highest, tonumber(ended))
  end
  return highest
end
if note then
  redis.call('HDEL', KEYS[1], note)
end
if ARGV[5] ~= '1' then
  local copied = false
  for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.sub(field, 1, 1) == '?' then
      copied = true
      break
    end
  end
  if not copied then
    return -1
  end
end
local attempt = tonumber(ARGV[1])
local ended = tonumber(redis.call('HGET', KEYS[1], send))
if ended == nil or attempt > ended then
  redis.call('HSET', KEYS[1], send, attempt)
  ended = attempt
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return ended
