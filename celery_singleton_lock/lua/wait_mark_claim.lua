-- Claim the wait mark of a task delivery about to wait for its lock (celery/waiting_marks.py).
-- KEYS[1]: the mark
-- ARGV[1]: this delivery's value (<worker>|<pid>|<host>|<nonce>)
-- ARGV[2]: its expiry in ms
-- returns {1}                   claimed: no other delivery of the message waits
--         {0, value, pttl}      another delivery's mark stands: its value and what is left of it
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1}
end
return {0, redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
