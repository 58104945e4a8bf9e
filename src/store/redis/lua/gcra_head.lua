-- tollgate: the fast path for a policy of one GCRA-based limit (token bucket, leaky meter,
-- leaky queue), check and peek only. Same stored format as the general script (four little-endian
-- doubles: write time in us, the descriptor T and cap in ns, fill in ns), so refunds and
-- syncs through the general script see the same state. This file, gcra_decay.lua and
-- gcra_tail.lua make the script (script.rs composes them at compile time).
--
-- KEYS[1]  the client's state
-- ARGV[1]  mode: 0 check, 1 peek
-- ARGV[2]  cost in units
-- ARGV[3]  emission interval T (ns)
-- ARGV[4]  cap: largest admissible TAT - now (ns)
-- ARGV[5]  (tests only) now in microseconds instead of the server's TIME
-- ARGV[6]  (tests only) extra TTL in milliseconds
--
-- The test-only arguments are absent in production calls: every argument is one more
-- string for the client to encode and for Redis to parse, on every decision.
--
-- Reply: code (0 allowed, 1 denied, 2 exceeds), the fill before the request (ns: TAT - now,
-- >= 0). GCRA only looks at TAT - now, so the client needs no time: it rebuilds the full
-- decision from these with the same function as the in-memory store. Or {3}: the key
-- holds a state written under other limits (or one to clamp), which the general script
-- converts; the client asks it instead.

local now
local slack = 0
if ARGV[5] == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[5])
  slack = tonumber(ARGV[6])
end

local t = tonumber(ARGV[3])
local cap = tonumber(ARGV[4])
local fill = 0
local raw = redis.call('GET', KEYS[1])
if raw then
  -- Binary doubles, not decimal text: a 16-digit microsecond time costs strtod's slow
  -- path to parse and a printf to write, several thousand server instructions per call.
  if #raw ~= 32 then return { 3 } end
  local at, d, c, f = struct.unpack('<dddd', raw)
  -- Anything but integers in [0, 2^53) (another tool's value, NaN, infinity) is no state,
  -- which the general script decides.
  if not (at >= 0 and at < 9007199254740992 and f >= 0 and f < 9007199254740992) then
    return { 3 }
  end
  if d ~= t or c ~= cap then return { 3 } end
  -- gcra_decay.lua follows, then gcra_tail.lua (see script.rs): the state's fill as of now,
  -- inline as in the batch script (a function call per request would cost more there);
  -- redis_semantics.rs compares both paths.
