-- tollgate: several requests of one connection in one call, decided in order (appended
-- to the general script, wrapped in a function of (KEYS, ARGV, redis): `general`). This
-- file, gcra_decay.lua and batch_tail.lua make it (script.rs composes them).
--
-- KEYS     the batch's keys, each once (on a cluster, KEYS holds the first only, which
--          routes the call to its node, and ARGV starts with the number of keys and all of
--          them, every one of a slot of that node: `CLUSTER` says which; the call's other
--          arguments follow, as below)
-- ARGV[1]  the number of lists of limits, then each list: its length, then the general
--          script's limit arguments (shadow, number of limits, per limit...)
-- ARGV[p]  (the last) the requests in order, as little-endian doubles; per request:
--            j + 256 * (list + 256 * (kind + 4 * (mode + 8 * timed)))
--          (j its key's index in KEYS, list the index of its list; kind 0 the fast
--          GCRA path, 1 the general script, 2 delete the key; mode as the scripts'; timed 1
--          when the request brings its own time), its cost, and when timed its time (us)
--          and TTL slack (ms)
--
-- Requests are decided one after the other, each exactly as its own call would be: a
-- request sees every earlier one's write, the same key twice included. What makes a
-- batch cheaper than its requests' own calls: Redis parses one command and enters Lua
-- once, and every argument it parses is a string it allocates and Lua interns, so the
-- requests travel in one string and each key once; TIME is read once, for every request
-- without a time of its own; every key is read with one MGET and written once at the end
-- (PSETEX, or DEL), whatever the number of its requests. Time stands still
-- inside a script, so the end state is the one the separate calls would have left.
--
-- Kind 0 (a check or peek under one GCRA limit: the fast script's requests) is decided
-- here, inline, as the fast GCRA script decides it: a key's state is decoded from its stored
-- value, kept as numbers once such a request charges it, and encoded once, for its
-- write. Anything else, and a kind 0 request on a state the fast script would hand to the
-- general one ({3}: written under other limits, or not a state), goes to `general`, whose
-- `redis` reads and writes the key's value here.
--
-- Reply: per request, either its fast reply, code (0, 1, 2) and fill, as one value,
-- fill * 4 + code (never negative; exact while fill < 2^51, as it is unless in debt); or
-- -1 - n, then n values: the general script's reply (none for a delete), or a fast reply
-- whose fill is 2^51 or more as its two values, code and fill (n = 2).

-- Globals cached in locals: in a script, reading a global costs a lookup in its table on
-- every use, a local a register.
local call, pack, sunpack = redis.call, struct.pack, struct.unpack

local K, A = KEYS, ARGV
if CLUSTER then
  local nk = tonumber(ARGV[1])
  K = { unpack(ARGV, 2, nk + 1) }
  A = { unpack(ARGV, nk + 2) }
end

local t = call('TIME')
-- Arithmetic converts the strings with one strtod each (tonumber() would run two).
local clock = t[1] * 1000000 + t[2]

local lists = {}
local p = 2
for l = 1, tonumber(A[1]) do
  local m = tonumber(A[p])
  lists[l] = { unpack(A, p + 1, p + m) }
  p = p + 1 + m
end
-- The fast path's T and cap of each list, read when a request first needs them.
local LT, LC = {}, {}

local D = A[p]
local R = { sunpack('<' .. string.rep('d', #D / 8), D) }
-- struct.unpack's last result is the position after the data.
local nr = #R - 1

-- Per key j: N[j] set (a number) while its state is F[j] (fill) after a fast charge,
-- its list and write time given by N[j]: l > 0, the list l and the script's own time;
-- -q, those of the timed request at R[q]. Otherwise val[j] is its value (false: none) and
-- W[j] its pending write: the PX text of the value, false for a delete, nil for none.
local val
if CLUSTER then
  -- One MGET may not span slots, even on one node: each key read alone.
  val = {}
  for j = 1, #K do
    val[j] = call('GET', K[j])
  end
else
  val = call('MGET', unpack(K))
end
local N, F, W = {}, {}, {}

-- The list, write time and TTL slack of a state in numbers whose N[j] is s.
local function origin(s)
  if s > 0 then return s, clock, 0 end
  local w = R[-s]
  w = (w - w % 256) / 256
  return w % 256, R[2 - s], R[3 - s]
end

-- The PX text of a state of fill f (ns) with a TTL slack (ms): whole milliseconds until
-- fresh, rounded up (exact integer division), plus the slack. TTLs repeat across a batch:
-- each is formatted once.
local PX = {}
local function px(f, slack)
  local n = f + 999999
  local ms = n / 1000000
  ms = ms - ms % 1
  if ms * 1000000 > n then ms = ms - 1 elseif (ms + 1) * 1000000 <= n then ms = ms + 1 end
  ms = ms + slack
  local text = PX[ms]
  if not text then
    text = string.format('%d', ms)
    PX[ms] = text
  end
  return text
end

-- Key j's state in numbers as the fast script stores it: the value and the PX text.
local function encode(j)
  local f = F[j]
  local l, at, slack = origin(N[j])
  return pack('<dddd', at, LT[l], LC[l], f), px(f, slack)
end

-- The key the general script is deciding; what it sees as `redis`: GET, SET and DEL on
-- that key's value here; TIME, the only other command it makes (and only without a time
-- given), goes to Redis.
local cur
local shim = {
  call = function(cmd, _, v, _, ttl)
    if cmd == 'GET' then return val[cur] end
    if cmd == 'SET' then
      val[cur], W[cur] = v, ttl
      return true
    end
    if cmd == 'DEL' then
      val[cur], W[cur] = false, false
      return true
    end
    return call(cmd)
  end,
}

local out, o = {}, 0
local q = 1
while q < nr do
  local q0 = q
  local w, cost = R[q], R[q + 1]
  q = q + 2
  local j = w % 256
  w = (w - j) / 256
  local l = w % 256
  w = (w - l) / 256
  -- w is kind + 4 * (mode + 8 * timed): 0 for the commonest request, a check on the fast
  -- path at the script's time.
  local kind, mode, now, timed = 0, 0, clock, false
  if w ~= 0 then
    kind = w % 4
    w = (w - kind) / 4
    mode = w % 8
    if w >= 8 then
      timed = true
      now = R[q]
      q = q + 2
    end
  end
  -- The fill (ns) of the key's state when the fast path decides this request; nil when
  -- the general script does.
  local fill
  if kind == 0 then
    local lt, lc = LT[l], LC[l]
    if not lt then
      local lim = lists[l]
      lt, lc = tonumber(lim[4]), tonumber(lim[6])
      LT[l], LC[l] = lt, lc
    end
    -- The state's write time and fill, when the fast path can read it.
    local at, f
    local s = N[j]
    if s then
      at = clock
      if s < 0 then s, at = origin(s) end
      if s == l or (LT[s] == lt and LC[s] == lc) then f = F[j] end
    else
      local v = val[j]
      if not v then
        fill = 0
      elseif #v == 32 then
        local d, c
        at, d, c, f = sunpack('<dddd', v)
        -- Anything but integers in [0, 2^53) is no state; other limits' state is converted.
        if not (at >= 0 and at < 9007199254740992 and f >= 0 and f < 9007199254740992)
          or d ~= lt or c ~= lc then
          f = nil
        end
      end
    end
    if f then
      fill = 0
      -- gcra_decay.lua follows (the fill as of now), then batch_tail.lua.
