-- tollgate: a GCRA state's fill as of now (composed into the three rate-limit scripts, inline:
-- a function call per request would cost more). In: `f` (ns, TAT minus the write time)
-- written at `at` (us), `now` (us); `fill` holds 0 and becomes f drained by the time since
-- (grown by it when the state was written ahead of now).
if at <= now then
  local back = (now - at) * 1000
  if back < f then fill = f - back end
else
  fill = f + (at - now) * 1000
end
