-- The default switch driver's scripts (driver.py) on the simulated switches' own state,
-- lp:{pod}:dev:...: this file, then tables.lua, then the script (device_<name>.lua), whose
-- ARGV begins with the fabric header (lua.py's fabric_header, 7 values). Its keys are the
-- driver's own, so `call` is redis.call (no txn.lua declared-key check).
local function call(command, ...) return redis.call(command, ...) end
