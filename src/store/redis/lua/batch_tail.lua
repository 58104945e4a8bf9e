    -- (After batch_head.lua and gcra_decay.lua: this closes `if f then`.)
    end
    if fill then
      local inc = cost * lt
      local code = 0
      -- A cost of zero is admitted at once and writes nothing.
      if inc ~= 0 then
        if inc > lc then
          code = 2
        else
          local diff = fill + inc
          if diff > lc then
            code = 1
          elseif mode == 0 then
            if diff == 0 then
              N[j], val[j], W[j] = nil, false, false
            elseif timed then
              N[j], F[j] = -q0, diff
            else
              N[j], F[j] = l, diff
            end
          end
        end
      end
      -- Every value of the reply is one more for Redis to convert and the client to parse.
      if fill < 2251799813685248 then
        o = o + 1
        out[o] = fill * 4 + code
      else
        out[o + 1], out[o + 2], out[o + 3] = -3, code, fill
        o = o + 3
      end
    end
  end
  if fill then
  elseif kind == 2 then
    N[j], val[j], W[j] = nil, false, false
    o = o + 1
    out[o] = -1
  else
    if N[j] then
      val[j], W[j] = encode(j)
      N[j] = nil
    end
    cur = j
    local slack = 0
    if timed then slack = R[q - 1] end
    local r = general({ K[j] }, { mode, cost, now, slack, unpack(lists[l]) }, shim)
    o = o + 1
    out[o] = -1 - #r
    for i = 1, #r do out[o + i] = r[i] end
    o = o + #r
  end
end

-- States of the script's own time under one list with one fill are one value with one
-- TTL (keys charged from empty by the same cost, say): one that repeats the state before
-- it is not encoded again.
local ls, lf, lv, lt
-- PSETEX rather than SET .. PX: one argument fewer for Redis to parse, the same effect.
for j = 1, #K do
  local s = N[j]
  if s then
    local f = F[j]
    if s > 0 then
      if f ~= lf or s ~= ls then
        -- px(f, 0) and encode(j), written out: a call of a Lua function costs more than
        -- its body here.
        local n = f + 999999
        local ms = n / 1000000
        ms = ms - ms % 1
        if ms * 1000000 > n then ms = ms - 1 elseif (ms + 1) * 1000000 <= n then ms = ms + 1 end
        lt = PX[ms]
        if not lt then
          lt = string.format('%d', ms)
          PX[ms] = lt
        end
        ls, lf, lv = s, f, pack('<dddd', clock, LT[s], LC[s], f)
      end
      call('PSETEX', K[j], lt, lv)
    else
      local v, t = encode(j)
      call('PSETEX', K[j], t, v)
    end
  else
    local w = W[j]
    if w then
      call('PSETEX', K[j], w, val[j])
    elseif w == false then
      call('DEL', K[j])
    end
  end
end
return out
