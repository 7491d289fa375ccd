-- Replace or delete a wait mark if it still has the value its caller read or wrote
-- (celery/waiting_marks.py): a delivery removing its own mark, or taking over the mark of a
-- dead delivery on its node.
-- KEYS[1]: the mark
-- ARGV[1]: the value it must have
-- ARGV[2]: the new value, '' to delete it
-- ARGV[3]: the new expiry in ms
-- returns 1 if the mark had that value (and was replaced or deleted), else 0
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return 1
