      -- (After general_head.lua and gcra_decay.lua, inside `parse`.)
      o = { k = 1, t = d, cap = size, fill = fill }
      p = p + 3
    else
      local r = d - WIN
      local sliding = r % 2
      local w = (r - sliding) / 2
      if w < 1 then return nil end
      if sliding == 0 then
        if p + 3 > m then return nil end
        o = { k = 2, w = w, limit = size, fin = v[p + 2], count = v[p + 3] }
        p = p + 4
      else
        if p + 4 > m then return nil end
        o = { k = 3, w = w, limit = size, fin = v[p + 2], prev = v[p + 3], cur = v[p + 4] }
        p = p + 5
      end
    end
    old[#old + 1] = o
  end
  return old
end

-- An old limit's units outstanding at now, rounded up.
local function outstanding(o)
  if o.k == 1 then return idiv(o.fill + o.t - 1, o.t) end
  if o.k == 2 then
    if o.fin - o.w <= now and now < o.fin then return o.count end
    return 0
  end
  local weighted, cur
  if now < o.fin and now >= o.fin - o.w then
    local e = now - (o.fin - o.w)
    weighted, cur = o.prev * (o.w - e), o.cur
  elseif now >= o.fin and now < o.fin + o.w then
    local e = now - o.fin
    weighted, cur = o.cur * (o.w - e), 0
  else
    return 0
  end
  return idiv(weighted + o.w - 1, o.w) + cur
end

local s = {}
for j = 1, words do s[j] = 0 end
local old = parse(redis.call('GET', key))
local existed = old ~= nil
-- Whether the state was converted (written under other limits) or clamped: then it is
-- stored even by a refusal, as the in-memory store keeps a converted state.
local changed = existed and #old ~= n

-- GCRA fills relative to now; windows as tags of their own grid.
for j = 1, n do
  local l = L[j]
  local o = old and old[j]
  if l.k == 1 then
    local f = 0
    if o then
      if o.k == 1 and o.t == l.t then
        f = o.fill
        -- The same limit keeps a debt above full; another cap is at most full.
        if o.cap ~= l.cap and f > l.cap then
          f = l.cap
          changed = true
        end
        if o.cap ~= l.cap then changed = true end
      else
        changed = true
        local u = outstanding(o)
        if u > 0 then f = math.min(u * l.t, l.cap) end
      end
    end
    l.fill = f
  elseif o then
    if o.k == l.k and o.w == l.w and (l.fin - o.fin) % l.w == 0 then
      -- The same grid: the counts as they are (at most the limit).
      local tag = (o.fin + l.shift) / l.w
      s[l.off] = tag
      -- The same limit keeps its counts (a debt above the limit included).
      if o.limit ~= l.limit then changed = true end
      local function clamp(x)
        if x > l.limit and o.limit ~= l.limit then
          return l.limit
        end
        return x
      end
      if l.k == 2 then
        s[l.off + 1] = clamp(o.count)
      else
        s[l.off + 1] = clamp(o.prev)
        s[l.off + 2] = clamp(o.cur)
      end
    else
      changed = true
      local u = math.min(outstanding(o), l.limit)
      if u > 0 then
        s[l.off] = l.tag
        if l.k == 2 then s[l.off + 1] = u else s[l.off + 2] = u end
      end
    end
  end
end

-- GCRA ------------------------------------------------------------------------------
-- remaining: the units admitted now (up to `cap` ahead of now, a queue's waiting ones
-- included), and the time until one more is, as gcra.rs reports.
local function gcra_report(l, fill, a)
  local room = l.cap
  local rem = 0
  if room > fill then rem = idiv(room - fill, l.t) end
  local nxt = 0
  if fill > 0 and rem < idiv(room, l.t) then nxt = fill + (rem + 1) * l.t - room end
  return { a, rem, fill, nxt }
end

local function gcra_eval(l, c)
  local fill = l.fill
  -- A cost of zero is admitted and spends nothing, even on a state in debt (above the cap).
  if c == 0 then return 0, 0, { fill }, gcra_report(l, fill, 1) end
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
  -- A cost of zero spends nothing, even on a count above the limit (a charge's debt).
  if c == 0 then return 0, 0, { s[l.off], s[l.off + 1] }, rep(count, 1) end
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
  -- A cost of zero spends nothing, even on counts above the limit (a charge's debt, a
  -- smaller limit's carried counts).
  if c == 0 then return 0, 0, { s[l.off], s[l.off + 1], s[l.off + 2] }, rep(cur, 1) end
  if c > l.limit then return 2, 0, nil, rep(cur, 0) end
  if fits(l, prev, cur, c) then return 0, 0, { l.tag, prev, cur + c }, rep(cur + c, 1) end
  return 1, sliding_wait(l, prev, cur, c), nil, rep(cur, 0)
end

local function eval(l, c)
  if l.k == 1 then return gcra_eval(l, c) end
  if l.k == 2 then return fixed_eval(l, c) end
  return sliding_eval(l, c)
end

-- Writes the state in the stored format (descriptors, window ends) and sets the TTL to
-- the time until it is fresh again; a fresh state is deleted.
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
  local out = { now }
  for j = 1, n do
    local l = L[j]
    if l.k == 1 then
      out[#out + 1] = l.t
      out[#out + 1] = l.cap
      out[#out + 1] = l.fill
    else
      out[#out + 1] = WIN + 2 * l.w + (l.k - 2)
      out[#out + 1] = l.limit
      -- The window's end; 0 for a window never used (tag 0).
      if s[l.off] == 0 then out[#out + 1] = 0 else out[#out + 1] = s[l.off] * l.w - l.shift end
      out[#out + 1] = s[l.off + 1]
      if l.k == 3 then out[#out + 1] = s[l.off + 2] end
    end
  end
  local ms = idiv(reset + 999999, 1000000) + extra
  -- PX as integer text: a Lua number would be printed with '%.17g'.
  redis.call('SET', key, struct.pack('<' .. string.rep('d', #out), unpack(out)), 'PX',
    string.format('%d', ms))
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
  store()
  return { now }
end

if mode == 4 then
  -- A unit is admitted again once TAT - now <= cap - T: from `cost` ns on.
  for j = 1, n do
    local l = L[j]
    if l.k == 1 and not (math.floor(shadow / 2 ^ (j - 1)) % 2 == 1) then
      local f = cost + l.cap - l.t
      if f > l.fill then l.fill = f end
    end
  end
  store()
  return { now }
end

if mode == 3 then
  -- The floor (after the limits), when given: the state is raised to it first, each limit
  -- to at most twice its capacity, as a charge is.
  if ARGV[i] ~= nil then
    local p = i
    for j = 1, n do
      local l = L[j]
      if l.k == 1 then
        local f = (tonumber(ARGV[p]) - now) * 1000
        p = p + 1
        if f > 2 * l.cap then f = 2 * l.cap end
        if f > l.fill then l.fill = f end
      elseif l.k == 2 then
        local tag, count = tonumber(ARGV[p]), tonumber(ARGV[p + 1])
        p = p + 2
        if tag == l.tag then
          local have = 0
          if s[l.off] == l.tag then have = s[l.off + 1] end
          if count > 2 * l.limit then count = 2 * l.limit end
          if count > have then
            s[l.off] = l.tag
            s[l.off + 1] = count
          end
        end
      else
        local tag, fprev, fcur = tonumber(ARGV[p]), tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2])
        p = p + 3
        if tag ~= l.tag then
          -- The floor's current window is the previous one now, or older.
          if tag ~= 0 and tag + 1 == l.tag then fprev = fcur else fprev = 0 end
          fcur = 0
        end
        local prev, cur = sliding_counts(l)
        if fprev > 2 * l.limit then fprev = 2 * l.limit end
        if fcur > 2 * l.limit then fcur = 2 * l.limit end
        if fprev > prev then prev = fprev end
        if fcur > cur then cur = fcur end
        if prev > 0 or cur > 0 then
          s[l.off] = l.tag
          s[l.off + 1] = prev
          s[l.off + 2] = cur
        end
      end
    end
  end
  for j = 1, n do
    local l = L[j]
    if l.k == 1 then
      local f = l.fill + cost * l.t
      if f > 2 * l.cap then f = 2 * l.cap end
      -- The charge is capped, not a longer debt already there (a ban).
      if f > l.fill then l.fill = f end
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
  store()
  local out = { now }
  for j = 1, n do
    local l = L[j]
    if l.k == 1 then
      out[#out + 1] = l.fill
    else
      out[#out + 1] = s[l.off]
      out[#out + 1] = s[l.off + 1]
      if l.k == 3 then out[#out + 1] = s[l.off + 2] end
    end
  end
  return out
end

-- Check (0) and peek (1).
local codes, vals, news, reps = {}, {}, {}, {}
local admitted = true
local function in_shadow(j)
  return math.floor(shadow / 2 ^ (j - 1)) % 2 == 1
end
for j = 1, n do
  codes[j], vals[j], news[j], reps[j] = eval(L[j], cost)
  if codes[j] ~= 0 and not in_shadow(j) then admitted = false end
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
if mode == 0 and not admitted and changed then
  -- Refused, but the state was converted: keep the conversion (nothing charged).
  store()
end
if mode == 0 and admitted then
  for j = 1, n do
    local l = L[j]
    local nw = news[j]
    -- A limit in shadow that would have refused is not charged.
    if nw then
      if l.k == 1 then
        l.fill = nw[1]
      else
        for x = 1, #nw do s[l.off + x - 1] = nw[x] end
      end
    end
  end
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
