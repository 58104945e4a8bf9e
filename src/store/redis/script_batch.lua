-- tollgate: several requests of one connection in one call, decided in order (appended
-- to script.lua and script_gcra.lua, each wrapped in a function of (KEYS, ARGV, redis):
-- `general` and `gcra`).
--
-- KEYS[i]  request i's key
-- ARGV     the number of lists of limits, then each list: its length, then the general
--          script's limit arguments (shadow, number of limits, per limit...); then per
--          request, in order: kind (0 the general script, 1 the fast GCRA script, 2
--          delete the key), mode, cost, now or '', TTL slack, and the index of its list
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
-- Per key its last write: the value (false for a delete) and the PX; keys in first-write
-- order.
local wv, wp, order = {}, {}, {}
-- What the scripts see as `redis`: GET, SET and DEL on the table; TIME, the only other
-- command they make (and only without a time given), goes to Redis.
local shim = {
  call = function(cmd, k, v, _, px)
    if cmd == 'GET' then return value[k] end
    if cmd == 'SET' or cmd == 'DEL' then
      if wv[k] == nil then order[#order + 1] = k end
      if cmd == 'DEL' then v = false end
      value[k], wv[k], wp[k] = v, v, px
      return true
    end
    return redis.call(cmd)
  end,
}

local lists = {}
local p = 2
for l = 1, tonumber(ARGV[1]) do
  local m = tonumber(ARGV[p])
  lists[l] = { unpack(ARGV, p + 1, p + m) }
  p = p + 1 + m
end

local out, o = {}, 0
for i = 1, #KEYS do
  local kind = ARGV[p]
  local key = { KEYS[i] }
  local r
  if kind == '2' then
    shim.call('DEL', KEYS[i])
    r = {}
  else
    local now = ARGV[p + 3]
    if now == '' then now = clock end
    local lim = lists[tonumber(ARGV[p + 5])]
    if kind == '1' then
      -- The fast script's arguments: mode, cost, T, cap, now, slack.
      r = gcra(key, { ARGV[p + 1], ARGV[p + 2], lim[4], lim[6], now, ARGV[p + 4] }, shim)
      -- {3}: a state written under other limits, which the general script converts.
      if r[1] == 3 and r[2] == nil then r = nil end
    end
    if r == nil then
      r = general(key, { ARGV[p + 1], ARGV[p + 2], now, ARGV[p + 4], unpack(lim) }, shim)
    end
  end
  p = p + 6
  o = o + 1
  out[o] = #r
  for j = 1, #r do out[o + j] = r[j] end
  o = o + #r
end

for _, k in ipairs(order) do
  local v = wv[k]
  if v then
    redis.call('SET', k, v, 'PX', wp[k])
  else
    redis.call('DEL', k)
  end
end
return out
