-- (After gcra_head.lua and gcra_decay.lua: this closes `if raw then`.)
end

-- The reply, fill * 4 + code, is exact while the fill is below 2^51 (it is, unless the
-- state is in debt after a settled cost or a ban).
local inc = cost * t
-- A cost of zero is admitted at once and writes nothing, even on a state in debt (a
-- settled cost above its estimate, a sync) whose fill is above the cap.
local code = 0
if inc > cap then
  code = 2
elseif inc > 0 then
  local diff = fill + inc
  if diff > cap then
    code = 1
  elseif mode == 0 then
    if diff == 0 then
      redis.call('DEL', KEYS[1])
    else
      -- TTL: whole milliseconds rounded up (exact integer division), plus the override slack.
      local n = diff + 999999
      local ms = math.floor(n / 1000000)
      if ms * 1000000 > n then ms = ms - 1 elseif (ms + 1) * 1000000 <= n then ms = ms + 1 end
      -- The TTL formatted as an integer here: Redis turns a Lua number argument of
      -- redis.call into text with a floating-point conversion ('%.17g' in Redis 7.0),
      -- several times as costly. PSETEX rather than SET .. PX: one argument fewer for
      -- Redis to parse, the same effect.
      redis.call('PSETEX', KEYS[1], string.format('%d', ms + slack), struct.pack('<dddd', now, t, cap, diff))
    end
  end
end
if fill < 2251799813685248 then return fill * 4 + code end
return { code, fill }
