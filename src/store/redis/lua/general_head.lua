-- tollgate: one rate-limit decision, atomic on the server. This file, gcra_decay.lua and
-- general_tail.lua make the general script (script.rs composes them at compile time).
--
-- KEYS[1]  the client's state (all limits in one string)
-- ARGV[1]  mode: 0 check, 1 peek, 2 refund, 3 sync (charge ARGV[2] units unconditionally),
--          4 ban (GCRA limits admit nothing for ARGV[2] ns)
-- ARGV[2]  cost in units (a duration in ns for a ban)
-- ARGV[3]  now in microseconds, or '' for the server's TIME (the override is for tests)
-- ARGV[4]  extra TTL in milliseconds (0 except with the test override)
-- ARGV[5]  the limits in shadow for this key (bit j-1: limit j), check and peek only: a
--          limit in shadow neither refuses nor delays; refusing, it is not charged, and
--          the others decide as if it were not there
-- ARGV[6]  number of limits, then per limit:
--            1 t tau cap free      GCRA, nanoseconds
--            2 w limit shift       fixed window, w and shift in microseconds
--            3 w limit shift       sliding window, w and shift in microseconds
--          (a window starts where now + shift is a multiple of w: at the offset past every
--          multiple of w since the Unix epoch)
--          then, for a sync only and optional, a floor: the state the caller holds for the
--          key, per limit: GCRA: its TAT in microseconds (0: none); fixed: tag count;
--          sliding: tag prev cur (tags as in the in-memory layout). The stored state is
--          raised to it (a state Redis lost, by a restart without persistence, comes back
--          from the instances that decided the key meanwhile) before the units are charged.
--
-- Stored value: integers as little-endian doubles (8 bytes each, Lua's struct 'd'): the
-- write time (us), then per limit a descriptor of two words and its state: GCRA: T (ns,
-- < 2^52) and cap (ns), then fill (ns: TAT minus the write time, >= 0); windows:
-- 2^52 + 2w + (0 fixed, 1 sliding) (w in us) and the limit, then the end of the window
-- the counts are for (us), then count (fixed) or prev cur (sliding). Every number stays
-- below 2^53 (checked when the store is built), so doubles are exact. A value that does
-- not parse so is no state.
--
-- The state describes the limits it was written under, so any instance can read it under
-- its own policy: limit by limit, by position, a limit takes over the state of the old one
-- as the in-memory store does (tollgate's policy docs): the same limit its state as it is
-- (a debt above full included); a token bucket of the same rate its exact fill (at most
-- full), a window on the same grid its counts (at most its limit); otherwise the old
-- limit's outstanding units rounded up, at most full.
--
-- Reply (modes 0, 1): n, then per limit: code (0 allowed, 1 denied, 2 exceeds), value
-- (wait or retry-after, ns), allowed (0/1), remaining, reset_after (ns), next_after (ns);
-- a limit in shadow reports what it would have answered.
-- Mode 2: {} or {now}. Mode 3: now, then the state words after the charge in the
-- in-memory layout (GCRA: fill; windows: tag count or tag prev cur).

local mode = tonumber(ARGV[1])
local cost = tonumber(ARGV[2])
local now
if ARGV[3] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[3])
end
local extra = tonumber(ARGV[4])
local shadow = tonumber(ARGV[5])
local n = tonumber(ARGV[6])
local WIN = 4503599627370496 -- 2^52

local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- The limits of this call. Internal state s (in-memory layout): s[1] the write time, then
-- per limit GCRA: fill | fixed: tag count | sliding: tag prev cur.
local L = {}
local words = 1
local i = 7
for j = 1, n do
  local k = tonumber(ARGV[i])
  if k == 1 then
    L[j] = { k = 1, t = tonumber(ARGV[i + 1]), tau = tonumber(ARGV[i + 2]),
             cap = tonumber(ARGV[i + 3]), free = tonumber(ARGV[i + 4]), off = words + 1 }
    i = i + 5
    words = words + 1
  else
    local l = { k = k, w = tonumber(ARGV[i + 1]), limit = tonumber(ARGV[i + 2]),
                shift = tonumber(ARGV[i + 3]), off = words + 1 }
    l.tag = idiv(now + l.shift, l.w) + 1
    l.e = now + l.shift - (l.tag - 1) * l.w
    l.fin = l.tag * l.w - l.shift -- the end of the current window
    L[j] = l
    i = i + 4
    if k == 2 then words = words + 2 else words = words + 3 end
  end
end

local key = KEYS[1]

-- The stored value, parsed: its write time and its limits (nil: no state).
local function parse(raw)
  if not raw or #raw < 24 or #raw % 8 ~= 0 then return nil end
  local m = #raw / 8
  local v = { struct.unpack('<' .. string.rep('d', m), raw) }
  for j = 1, m do
    local x = v[j]
    if not (x >= 0 and x < 9007199254740992) then return nil end
  end
  local at = v[1]
  local old = {}
  local p = 2
  while p <= m do
    local d, size = v[p], v[p + 1]
    if size == nil then return nil end
    local o
    if d < WIN then
      if d < 1 or p + 2 > m then return nil end
      local f = v[p + 2]
      local fill = 0
      -- gcra_decay.lua follows (the fill as of now), then general_tail.lua.
