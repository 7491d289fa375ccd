-- Read a task call's done mark (celery/done_marks.py): sent in the same round trip as an
-- acquire attempt, after it.
-- KEYS[1]: the done mark (P{T}:done:<task id>)
-- returns the highest attempt of the task id that ended, -1 if none did
return tonumber(redis.call('GET', KEYS[1])) or -1
