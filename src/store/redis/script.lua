-- tollgate: one rate-limit decision, atomic on the server.
--
-- KEYS[1]  the client's state for one policy (all limits in one string)
-- ARGV[1]  mode: 0 check, 1 peek, 2 refund, 3 sync (charge ARGV[2] units unconditionally)
-- ARGV[2]  cost in units
-- ARGV[3]  now in microseconds, or '' for the server's TIME (the override is for tests)
-- ARGV[4]  extra TTL in milliseconds (0 except with the test override)
-- ARGV[5]  number of limits, then per limit:
--            1 t tau cap free      GCRA, nanoseconds
--            2 w limit shift       fixed window, w and shift in microseconds
--            3 w limit shift       sliding window, w and shift in microseconds
--          (a window starts where now + shift is a multiple of w: at the offset past every
--          multiple of w since the Unix epoch)
--
-- Stored value: integers as little-endian doubles (8 bytes each, Lua's struct 'd'): the
-- write time (us), then per limit GCRA: fill (ns: TAT minus the write time, >= 0) |
-- fixed: tag count | sliding: tag prev cur. Every number stays below 2^53 (checked when
-- the store is built), so doubles are exact. Binary rather than decimal text because
-- parsing a 16-digit time (strtod's slow path) and printing it cost the server more than
-- the decision itself; a value of another length or with another number is no state.
--
-- Reply (modes 0, 1): n, then per limit: code (0 allowed, 1 denied, 2 exceeds), value
-- (wait or retry-after, ns), allowed (0/1), remaining, reset_after (ns), next_after (ns).
-- Mode 2: {} or {now}. Mode 3: now, then the stored words after the charge.

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
local n = tonumber(ARGV[5])

local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local L = {}
local words = 1
local i = 6
for j = 1, n do
  local k = tonumber(ARGV[i])
  if k == 1 then
    L[j] = { k = 1, t = tonumber(ARGV[i + 1]), tau = tonumber(ARGV[i + 2]),
             cap = tonumber(ARGV[i + 3]), free = tonumber(ARGV[i + 4]), off = words + 1 }
    i = i + 5
    words = words + 1
  else
    L[j] = { k = k, w = tonumber(ARGV[i + 1]), limit = tonumber(ARGV[i + 2]),
             shift = tonumber(ARGV[i + 3]), off = words + 1 }
    i = i + 4
    if k == 2 then words = words + 2 else words = words + 3 end
  end
end

local key = KEYS[1]
local fmt = '<' .. string.rep('d', words)
local s = {}
local raw = redis.call('GET', key)
local existed = false
if raw and #raw == 8 * words then
  s = { struct.unpack(fmt, raw) }
  s[words + 1] = nil -- unpack's last result is the position after the data
  -- Anything but integers in [0, 2^53) (another tool's value, NaN, infinity) is no state.
  existed = true
  for j = 1, words do
    local w = s[j]
    if not (w >= 0 and w < 9007199254740992) then
      existed = false
      break
    end
  end
end
if not existed then
  s = {}
  for j = 1, words do s[j] = 0 end
end

-- GCRA fills relative to now.
local at = s[1]
for j = 1, n do
  local l = L[j]
  if l.k == 1 then
    local f = s[l.off]
    if at <= now then
      local d = (now - at) * 1000
      if d >= f then f = 0 else f = f - d end
    else
      f = f + (at - now) * 1000
    end
    l.fill = f
  else
    local t = now + l.shift
    l.tag = idiv(t, l.w) + 1
    l.e = t - (l.tag - 1) * l.w
  end
end

-- GCRA ------------------------------------------------------------------------------
local function gcra_report(l, fill, a)
  local room = l.tau + l.t
  local rem = 0
  if room > fill then rem = idiv(room - fill, l.t) end
  local nxt = 0
  if fill > 0 then nxt = fill - (room - (rem + 1) * l.t) end
  return { a, rem, fill, nxt }
end

local function gcra_eval(l, c)
  local fill = l.fill
  local inc = c * l.t
  if inc > l.cap then return 2, 0, nil, gcra_report(l, fill, 0) end
  local diff = fill + inc
  if diff <= l.cap then
    -- A cost of zero spends nothing and waits for nothing, even behind a backlog.
    local wait = 0
    if c > 0 then wait = diff - l.free end
    if wait < 0 then wait = 0 end
    return 0, wait, { diff }, gcra_report(l, diff, 1)
  end
  return 1, diff - l.cap, nil, gcra_report(l, fill, 0)
end

-- Fixed window ----------------------------------------------------------------------
local function fixed_eval(l, c)
  local count = 0
  if s[l.off] == l.tag then count = s[l.off + 1] end
  local function rep(cnt, a)
    local reset = 0
    if cnt > 0 then reset = (l.w - l.e) * 1000 end
    local rem = l.limit - cnt
    if rem < 0 then rem = 0 end
    return { a, rem, reset, reset }
  end
  if c > l.limit then return 2, 0, nil, rep(count, 0) end
  if count + c <= l.limit then return 0, 0, { l.tag, count + c }, rep(count + c, 1) end
  return 1, (l.w - l.e) * 1000, nil, rep(count, 0)
end

-- Sliding window --------------------------------------------------------------------
local function sliding_counts(l)
  local t0 = s[l.off]
  if t0 == l.tag then
    return s[l.off + 1], s[l.off + 2]
  elseif t0 ~= 0 and t0 + 1 == l.tag then
    return s[l.off + 2], 0
  end
  return 0, 0
end

local function fits(l, prev, cur, c)
  return cur + c <= l.limit and prev * (l.w - l.e) <= (l.limit - cur - c) * l.w
end

-- floor(a * W_ns / den), or nil when that is at least W_ns.
local function scaled_div(l, a, den)
  local p = a * l.w
  local q = idiv(p, den)
  if q >= l.w then return nil end
  local r = p - q * den
  return q * 1000 + idiv(r * 1000, den)
end

local function sliding_wait(l, prev, cur, c)
  if fits(l, prev, cur, c) then return 0 end
  local wn = l.w * 1000
  local en = l.e * 1000
  local need = l.limit - (cur + c)
  if need >= 0 and prev > 0 then
    local slack = scaled_div(l, need, prev)
    if slack ~= nil and slack > 0 then
      local emin = wn - slack
      if emin > en then return emin - en end
    end
  end
  local emin2 = 0
  if cur > 0 then
    local sl = scaled_div(l, l.limit - c, cur)
    if sl ~= nil then emin2 = wn - sl end
  end
  return (wn - en) + emin2
end

local function sliding_eval(l, c)
  local prev, cur = sliding_counts(l)
  local function rep(cu, a)
    local slack = l.limit * l.w - prev * (l.w - l.e) - cu * l.w
    local rem = 0
    if slack > 0 then rem = idiv(slack, l.w) end
    local reset = 0
    if cu > 0 then
      reset = (2 * l.w - l.e) * 1000
    elseif prev > 0 then
      reset = (l.w - l.e) * 1000
    end
    local nxt = 0
    if rem < l.limit then nxt = sliding_wait(l, prev, cu, rem + 1) end
    return { a, rem, reset, nxt }
  end
  if c > l.limit then return 2, 0, nil, rep(cur, 0) end
  if fits(l, prev, cur, c) then return 0, 0, { l.tag, prev, cur + c }, rep(cur + c, 1) end
  return 1, sliding_wait(l, prev, cur, c), nil, rep(cur, 0)
end

local function eval(l, c)
  if l.k == 1 then return gcra_eval(l, c) end
  if l.k == 2 then return fixed_eval(l, c) end
  return sliding_eval(l, c)
end

-- Writes s (with GCRA fills already relative to now) and sets the TTL to the time until
-- the state is fresh again; a fresh state is deleted.
local function store()
  local reset = 0
  for j = 1, n do
    local _, _, _, r = eval(L[j], 0)
    if r[3] > reset then reset = r[3] end
  end
  if reset == 0 then
    redis.call('DEL', key)
    return
  end
  s[1] = now
  local ms = idiv(reset + 999999, 1000000) + extra
  -- PX as integer text: a Lua number would be printed with '%.17g'.
  redis.call('SET', key, struct.pack(fmt, unpack(s, 1, words)), 'PX', string.format('%d', ms))
end

local function put_fills()
  for j = 1, n do
    local l = L[j]
    if l.k == 1 then s[l.off] = l.fill end
  end
end

if mode == 2 then
  if not existed then return {} end
  for j = 1, n do
    local l = L[j]
    if l.k == 1 then
      local f = l.fill - cost * l.t
      if f < 0 then f = 0 end
      l.fill = f
    elseif l.k == 2 then
      if s[l.off] == l.tag then
        local c = s[l.off + 1] - cost
        if c < 0 then c = 0 end
        s[l.off + 1] = c
      end
    else
      local t0 = s[l.off]
      if t0 == l.tag or (t0 ~= 0 and t0 + 1 == l.tag) then
        local c = s[l.off + 2] - cost
        if c < 0 then c = 0 end
        s[l.off + 2] = c
      end
    end
  end
  put_fills()
  store()
  return { now }
end

if mode == 3 then
  for j = 1, n do
    local l = L[j]
    if l.k == 1 then
      local f = l.fill + cost * l.t
      if f > 2 * l.cap then f = 2 * l.cap end
      l.fill = f
    elseif l.k == 2 then
      local count = 0
      if s[l.off] == l.tag then count = s[l.off + 1] end
      count = count + cost
      if count > 2 * l.limit then count = 2 * l.limit end
      s[l.off] = l.tag
      s[l.off + 1] = count
    else
      local prev, cur = sliding_counts(l)
      cur = cur + cost
      if cur > 2 * l.limit then cur = 2 * l.limit end
      s[l.off] = l.tag
      s[l.off + 1] = prev
      s[l.off + 2] = cur
    end
  end
  put_fills()
  store()
  local out = { now }
  for j = 2, words do out[j] = s[j] end
  return out
end

-- Check (0) and peek (1).
local codes, vals, news, reps = {}, {}, {}, {}
local admitted = true
for j = 1, n do
  codes[j], vals[j], news[j], reps[j] = eval(L[j], cost)
  if codes[j] ~= 0 then admitted = false end
end
if not admitted and n > 1 then
  -- Nothing is charged: limits that would have admitted report their state as is.
  for j = 1, n do
    if codes[j] == 0 then
      local _, _, _, r = eval(L[j], 0)
      reps[j] = r
    end
  end
end
if mode == 0 and admitted then
  for j = 1, n do
    local l = L[j]
    local nw = news[j]
    if l.k == 1 then
      l.fill = nw[1]
    else
      for x = 1, #nw do s[l.off + x - 1] = nw[x] end
    end
  end
  put_fills()
  -- TTL from the post-state reports (computed by store()).
  store()
end
local out = { n }
for j = 1, n do
  local r = reps[j]
  local b = #out
  out[b + 1] = codes[j]
  out[b + 2] = vals[j]
  out[b + 3] = r[1]
  out[b + 4] = r[2]
  out[b + 5] = r[3]
  out[b + 6] = r[4]
end
return out
