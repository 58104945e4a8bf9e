-- tollgate: the fast path for a policy of one GCRA-based limit (token bucket, leaky meter,
-- leaky queue), check and peek only. Same stored format as the general script (four little-endian
-- doubles: write time in us, the descriptor T and cap in ns, fill in ns), so refunds and
-- syncs through the general script see the same state. This file, gcra_decay.lua and
-- gcra_tail.lua make the script (script.rs composes them at compile time).
--
-- KEYS[1]  the client's state
-- ARGV[1]  four little-endian doubles: mode (0 check, 1 peek), cost in units, emission
--          interval T (ns), cap: largest admissible TAT - now (ns)
-- ARGV[2]  (tests only) now in microseconds instead of the server's TIME
-- ARGV[3]  (tests only) extra TTL in milliseconds
--
-- One binary argument rather than four numbers in text: Redis parses every argument into
-- a string of its own, Lua interns each, and tonumber() runs strtod twice on each (once to
-- check, once to convert), on every decision. The test-only arguments are absent in
-- production calls for the same reason.
--
-- Reply: fill * 4 + code, as one integer (code 0 allowed, 1 denied, 2 exceeds; fill the
-- state's fill before the request, ns: TAT - now, >= 0), or {code, fill} when the fill is
-- 2^51 or more (a state in debt: fill * 4 would not be exact). GCRA only looks at
-- TAT - now, so the client needs no time: it rebuilds the full decision from these with
-- the same function as the in-memory store. Or 3: the key holds a state written under
-- other limits (or one to clamp), which the general script converts; the client asks it
-- instead.

local mode, cost, t, cap = struct.unpack('<dddd', ARGV[1])
local now
local slack = 0
if ARGV[2] == nil then
  -- Arithmetic converts TIME's strings with one strtod each (tonumber() would run two).
  local tm = redis.call('TIME')
  now = tm[1] * 1000000 + tm[2]
else
  now = tonumber(ARGV[2])
  slack = tonumber(ARGV[3])
end

local fill = 0
local raw = redis.call('GET', KEYS[1])
if raw then
  -- Binary doubles, not decimal text: a 16-digit microsecond time costs strtod's slow
  -- path to parse and a printf to write, several thousand server instructions per call.
  if #raw ~= 32 then return 3 end
  local at, d, c, f = struct.unpack('<dddd', raw)
  -- Anything but integers in [0, 2^53) (another tool's value, NaN, infinity) is no state,
  -- which the general script decides.
  if not (at >= 0 and at < 9007199254740992 and f >= 0 and f < 9007199254740992) then
    return 3
  end
  if d ~= t or c ~= cap then return 3 end
  -- gcra_decay.lua follows, then gcra_tail.lua (see script.rs): the state's fill as of now,
  -- inline as in the batch script (a function call per request would cost more there);
  -- redis_semantics.rs compares both paths.
