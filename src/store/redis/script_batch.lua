-- tollgate: several requests of one connection in one call, decided in order (appended
-- to script.lua and script_gcra.lua, each wrapped in a function of (KEYS, ARGV, redis):
-- `general` and `gcra`).
--
-- KEYS[i]  request i's key
-- ARGV     per request, in order: kind (0 the general script, 1 the fast GCRA script,
--          2 delete the key), the number of arguments that follow, then the general
--          script's arguments (mode, cost, now or '', TTL slack, shadow, limits...)
--
-- Requests are decided one after the other, each exactly as its own call would be: a
-- request sees every earlier one's write, the same key twice included. What makes a
-- batch cheaper than its requests' own calls: Redis parses one command and enters Lua
-- once; TIME is read once, for every request without a time of its own; every key is
-- read with one MGET, then the requests read and write a table of the values, and each
-- key's last write (SET with its TTL, or DEL) goes to Redis at the end: one SET per key
-- of the batch, not per request. Time stands still inside a script, so the end state is
-- the one the separate calls would have left.
--
-- Reply: per request, the length of its own reply, then that reply.

local t = redis.call('TIME')
local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])

local value = {}
local fetched = redis.call('MGET', unpack(KEYS))
for i = 1, #KEYS do value[KEYS[i]] = fetched[i] end
-- Per key its last write ({ value, PX } or false for a delete), in first-write order.
local writes, order = {}, {}
local function write(k, w)
  if writes[k] == nil then order[#order + 1] = k end
  writes[k] = w
end
-- What the scripts see as `redis`: GET, SET and DEL on the table; anything else (TIME,
-- which they only read without a time given) goes to Redis.
local shim = {
  call = function(cmd, ...)
    local k, v, _, px = ...
    if cmd == 'GET' then return value[k] end
    if cmd == 'SET' then
      value[k] = v
      write(k, { v, px })
      return true
    end
    if cmd == 'DEL' then
      value[k] = false
      write(k, false)
      return 1
    end
    return redis.call(cmd, ...)
  end,
}

local out = {}
local p = 1
for i = 1, #KEYS do
  local kind = ARGV[p]
  local argc = tonumber(ARGV[p + 1])
  local A = {}
  for j = 1, argc do A[j] = ARGV[p + 1 + j] end
  p = p + 2 + argc
  local key = { KEYS[i] }
  local r
  if kind == '2' then
    shim.call('DEL', KEYS[i])
    r = {}
  else
    if A[3] == '' then A[3] = clock end
    if kind == '1' then
      -- The fast script's arguments: mode, cost, T, cap, now, slack.
      r = gcra(key, { A[1], A[2], A[8], A[10], A[3], A[4] }, shim)
      -- {3}: a state written under other limits, which the general script converts.
      if r[1] == 3 and r[2] == nil then r = nil end
    end
    if r == nil then r = general(key, A, shim) end
  end
  out[#out + 1] = #r
  for j = 1, #r do out[#out + 1] = r[j] end
end

for _, k in ipairs(order) do
  local w = writes[k]
  if w then
    redis.call('SET', k, w[1], 'PX', w[2])
  else
    redis.call('DEL', k)
  end
end
return out
