-- The batch's fence (sonic_driver.py), checked in the same script as the batch's write
-- so that nothing can come between: Lightpath's own CONFIG_DB table LIGHTPATH_FENCE, one
-- row per lease (`LIGHTPATH_FENCE|<lease id>`, field `token`) with the highest token a
-- batch of that lease carried, kept `keep_ms` after its last batch. SONiC's daemons do
-- not read the table; `config save` keeps it with the cross-connects. Answers the newer
-- token seen when `token` is older (the batch must then write nothing), else nil, the
-- token recorded. lease "": the batch is not fenced.
local function older_than_seen(lease, token, keep_ms)
  if lease == '' then return nil end
  local key = 'LIGHTPATH_FENCE|' .. lease
  local seen = redis.call('HGET', key, 'token')
  if seen and tonumber(token) < tonumber(seen) then return seen end
  redis.call('HSET', key, 'token', token)
  redis.call('PEXPIRE', key, keep_ms)
  return nil
end
