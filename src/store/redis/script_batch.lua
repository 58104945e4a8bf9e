-- tollgate: several requests of one connection in one call, decided in order (appended
-- to script.lua and script_gcra.lua, each wrapped in a function: `general` and `gcra`).
--
-- KEYS[i]  request i's key
-- ARGV     per request, in order: kind (0 the general script, 1 the fast GCRA script,
--          2 delete the key), the number of arguments that follow, then the general
--          script's arguments (mode, cost, now or '', TTL slack, shadow, limits...)
--
-- Requests are decided one after the other, each exactly as its own call would be: a
-- request sees every earlier one's write, the same key twice included. The server's TIME
-- is read once, for every request without a time of its own.
--
-- Reply: per request, the length of its own reply, then that reply.

local t = redis.call('TIME')
local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
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
    redis.call('DEL', KEYS[i])
    r = {}
  else
    if A[3] == '' then A[3] = clock end
    if kind == '1' then
      -- The fast script's arguments: mode, cost, T, cap, now, slack.
      r = gcra(key, { A[1], A[2], A[8], A[10], A[3], A[4] })
      -- {3}: a state written under other limits, which the general script converts.
      if r[1] == 3 and r[2] == nil then r = nil end
    end
    if r == nil then r = general(key, A) end
  end
  out[#out + 1] = #r
  for j = 1, #r do out[#out + 1] = r[j] end
end
return out
