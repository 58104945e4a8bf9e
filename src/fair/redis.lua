-- tollgate: one fair-sharing decision (HTB with borrowing), the pool and the key at once.
-- The same steps as `decide` in src/fair/share.rs, on integers below 2^53 (exact doubles).
--
-- KEYS[1]  the pool's state: five little-endian doubles (write time in us, fill in ns,
--          activity period, weight sums of the current and the previous period)
-- KEYS[2]  the key's state: five doubles (write time in us, share fill and ceiling fill
--          in ns, the activity period it last asked in and the one before, plus one)
-- ARGV     pool interval (ns), pool cap (ns), activity period (us), the key's weight,
--          ceiling interval (ns), ceiling cap (ns), the largest active weight
--          sum counted, the longest share interval (ns);
--          (tests only) now in us instead of the server's TIME, and extra TTL in ms
--
-- Reply: { admitted (1 or 0), retry-after (ns), remaining, reset-after (ns),
--          next-after (ns): until remaining grows by one }.

local now
local slack = 0
if ARGV[9] == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[9])
  slack = tonumber(ARGV[10])
end
local pool_t = tonumber(ARGV[1])
local pool_cap = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local weight = tonumber(ARGV[4])
local ceil_t = tonumber(ARGV[5])
local ceil_cap = tonumber(ARGV[6])
local active_limit = tonumber(ARGV[7])
local max_share_t = tonumber(ARGV[8])

-- floor(a / b) for integers below 2^53, corrected for the division's rounding.
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local function exact(x)
  return x >= 0 and x < 9007199254740992 and x == math.floor(x)
end

-- A fill (TAT - now, ns) written at `at` (us), as of now.
local function fill(at, f)
  if at <= now then
    local back = (now - at) * 1000
    if back < f then return f - back end
    return 0
  end
  return f + (at - now) * 1000
end

local p_fill, p_epoch, s0, s1 = 0, 0, 0, 0
local raw = redis.call('GET', KEYS[1])
if raw and #raw == 40 then
  local at, f, e, a, b = struct.unpack('<ddddd', raw)
  if exact(at) and exact(f) and exact(e) and exact(a) and exact(b) then
    p_fill, p_epoch, s0, s1 = fill(at, f), e, a, b
  end
end
local k_share, k_ceil, seen, before = 0, 0, 0, 0
raw = redis.call('GET', KEYS[2])
if raw and #raw == 40 then
  local at, sf, cf, sn, bf = struct.unpack('<ddddd', raw)
  if exact(at) and exact(sf) and exact(cf) and exact(sn) and exact(bf) then
    k_share, k_ceil, seen, before = fill(at, sf), fill(at, cf), sn, bf
  end
end

local epoch = fdiv(now, period)
if p_epoch ~= epoch then
  if p_epoch + 1 == epoch then s1 = s0 else s1 = 0 end
  s0 = 0
  p_epoch = epoch
end
if seen ~= epoch + 1 then
  s0 = s0 + weight
  before = seen
  seen = epoch + 1
end
local in_previous = before == epoch
local active = s1
if not in_previous then active = active + weight end
if s0 > active then active = s0 end
-- A key's share interval when the keys asking weigh `a`, and its cap at interval `t`.
local function share_interval(a)
  if a > active_limit then a = active_limit end
  local t = fdiv(pool_t * a + weight - 1, weight)
  if t > max_share_t then t = max_share_t end
  if t < ceil_t then t = ceil_t end
  return t
end
local function share_cap_at(t)
  return math.max(fdiv(pool_cap, 2), t)
end
local share_t = share_interval(active)
local share_cap = share_cap_at(share_t)

local fc = k_ceil + ceil_t
local fp = p_fill + pool_t
local fs = k_share + share_t
local ceil_ok = fc <= ceil_cap
local pool_ok = fp <= pool_cap
local share_ok = fs <= share_cap
local spare_ok = 2 * fp <= pool_cap

local reply
if ceil_ok and pool_ok and (share_ok or spare_ok) then
  k_ceil = fc
  p_fill = fp
  if share_ok then k_share = fs end
  local by_share = 0
  if share_cap > k_share then by_share = fdiv(share_cap - k_share, share_t) end
  local by_spare = 0
  local half = fdiv(pool_cap, 2)
  if half > fp then by_spare = fdiv(half - fp, pool_t) end
  local remaining = math.min(fdiv(ceil_cap - fc, ceil_t), fdiv(pool_cap - fp, pool_t),
    math.max(by_share, by_spare))
  -- One more once the ceiling and the pool hold it, and the share or the spare half (a
  -- pool of burst 1 never lends); nil: never.
  local want = remaining + 1
  local function wait_for(f, t, cap)
    if want * t > cap then return nil end
    return math.max(f + want * t - cap, 0)
  end
  local either = wait_for(k_share, share_t, share_cap)
  if 2 * pool_t <= pool_cap then
    local lend = wait_for(fp, pool_t, half)
    if lend ~= nil and (either == nil or lend < either) then either = lend end
  end
  local by_c, by_p = wait_for(fc, ceil_t, ceil_cap), wait_for(fp, pool_t, pool_cap)
  local next_after = 0
  if by_c ~= nil and by_p ~= nil and either ~= nil then next_after = math.max(by_c, by_p, either) end
  reply = { 1, 0, remaining, math.max(fc, k_share), next_after }
else
  -- The share's wait: the active weight only falls if nothing else happens (to what
  -- asked in this period at the next, to the key alone from the one after), and the
  -- share's interval with it; the earliest of the three periods' waits.
  local next_start = ((epoch + 1) * period - now) * 1000
  local starts = { 0, next_start, next_start + period * 1000 }
  local actives = { active, s0, weight }
  local share_wait
  for i = 1, 3 do
    local t = share_interval(actives[i])
    local at = math.max(k_share + t - share_cap_at(t), 0, starts[i])
    if share_wait == nil or at < share_wait then share_wait = at end
    if i == 3 or at < starts[i + 1] then break end
  end
  local wait = share_wait
  -- A pool whose one interval is more than half its burst (a burst of 1) never lends.
  if 2 * pool_t <= pool_cap then
    wait = math.min(wait, fdiv(math.max(2 * fp - pool_cap, 0) + 1, 2))
  end
  local retry = math.max(fc - ceil_cap, fp - pool_cap, wait, 0)
  reply = { 0, retry, 0, math.max(k_ceil, k_share), retry }
end

-- Both states live until the later of their fills' end and the end of the period after
-- this one (while the key counts as asking), in whole ms rounded up, plus the slack.
local function ttl(f)
  local until_ns = math.max(f, ((epoch + 2) * period - now) * 1000)
  return string.format('%d', fdiv(until_ns + 999999, 1000000) + slack)
end
redis.call('SET', KEYS[1], struct.pack('<ddddd', now, p_fill, p_epoch, s0, s1), 'PX', ttl(p_fill))
redis.call('SET', KEYS[2], struct.pack('<ddddd', now, k_share, k_ceil, seen, before), 'PX',
  ttl(math.max(k_share, k_ceil)))
return reply
