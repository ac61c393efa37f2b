"""The Lua scripts behind :class:`node.store.RegionStore`: every mutation of a region is one of them.

Each runs atomically in Redis, so a change is in the records, the lease set, the region version
and the change stream together or in none of them (the transactional outbox of ``node.store``).
Every key a script touches carries the region's hash tag, so each stays single-slot on Redis
Cluster. Only Redis 6.2 commands. The record JSON a script writes starts with its version
(``{"version":N,…``): ``node.store.stored_records.stored_version`` reads it back without parsing the record, and
``UPDATE`` compares it. ``REGISTER`` and ``UPDATE`` take many records at once: the store
coalesces concurrent writes into one script call (``node.store.batch``). This module does no I/O; the
store registers the scripts.
"""

from __future__ import annotations

# KEYS: agents, leases, version, changes, loads. ARGV: stream maxlen, the load channel, then per
# record 4 values: agent_id, body (record JSON without version), lease expiry ms, now ms. Returns
# per record 2 values: its version and 1 if the agent was not stored (decided here, so of
# concurrent first registrations exactly one is new; the same agent twice in one batch: the
# first). The registration's load is the record's: a load reported before it is dropped.
REGISTER = """
local out = {}
for i = 3, #ARGV, 4 do
  local id = ARGV[i]
  local v = redis.call('INCR', KEYS[3])
  local rec = '{"version":' .. v .. ',' .. string.sub(ARGV[i + 1], 2)
  local created = redis.call('HSET', KEYS[1], id, rec)
  redis.call('HDEL', KEYS[5], id)
  redis.call('ZADD', KEYS[2], ARGV[i + 2], id)
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[1], v .. '-0',
             'kind', 'upsert', 'agent_id', id, 'at', ARGV[i + 3], 'record', rec)
  out[#out + 1] = v
  out[#out + 1] = created
end
return out
"""

# KEYS: agents, leases, version, changes, loads. ARGV: stream maxlen, the load channel, then per
# update 7 values: agent_id, expected version ('' = lease only), body, new lease expiry ms
# ('' = keep), now ms, require a live lease ('1'/'0'), load JSON ('' = none). Returns per update
# 2 values: {0, ''} unknown (or its lease has passed), {1, version} lease moved (and/or load
# stored), {2, version} changed, {-1, current record} conflict. A load goes to the loads hash and,
# one message per call ("agent_id load" lines), to the load channel: no version, no stream entry,
# so nothing for the region's peers (it stays home).
UPDATE = """
local out, loads = {}, {}
for i = 3, #ARGV, 7 do
  local id, expected, body, lease, now = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  local cur = redis.call('HGET', KEYS[1], id)
  if cur and ARGV[i + 5] == '1' then
    local score = redis.call('ZSCORE', KEYS[2], id)
    if (not score) or tonumber(score) <= tonumber(now) then cur = false end
  end
  if not cur then
    out[#out + 1] = 0
    out[#out + 1] = ''
  else
    if ARGV[i + 6] ~= '' then
      redis.call('HSET', KEYS[5], id, ARGV[i + 6])
      loads[#loads + 1] = id .. ' ' .. ARGV[i + 6]
    end
    local cv = tonumber(string.match(cur, '^{"version":(%d+),'))
    if expected == '' then
      if lease ~= '' then redis.call('ZADD', KEYS[2], lease, id) end
      out[#out + 1] = 1
      out[#out + 1] = cv
    elseif cv ~= tonumber(expected) then
      out[#out + 1] = -1
      out[#out + 1] = cur
    else
      local v = redis.call('INCR', KEYS[3])
      local rec = '{"version":' .. v .. ',' .. string.sub(body, 2)
      redis.call('HSET', KEYS[1], id, rec)
      if lease ~= '' then redis.call('ZADD', KEYS[2], lease, id) end
      redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[1], v .. '-0',
                 'kind', 'status', 'agent_id', id, 'at', now, 'record', rec)
      out[#out + 1] = 2
      out[#out + 1] = v
    end
  end
end
if #loads > 0 then redis.call('PUBLISH', ARGV[2], table.concat(loads, '\\n')) end
return out
"""

# KEYS: agents, leases, version, changes, loads. ARGV: stream maxlen, the load channel (unused: the
# batch shape of the others), now ms, then the renewals as one argument, a line "agent_id expiry_ms"
# each (an agent id holds neither a space nor a line break): one argument to encode and parse, not
# two per renewal. A lease-only renewal (a session's, node.http.sessions): the lease moves only if
# it is still running, as UPDATE's does, without reading the record. Returns a string of one
# character per renewal: "1" (moved) or "0" (no lease: unknown, or passed).
RENEW = """
local out = {}
local now = tonumber(ARGV[3])
for id, lease in string.gmatch(ARGV[4], '([^ \\n]+) (%d+)') do
  local score = redis.call('ZSCORE', KEYS[2], id)
  if score and tonumber(score) > now then
    redis.call('ZADD', KEYS[2], lease, id)
    out[#out + 1] = '1'
  else
    out[#out + 1] = '0'
  end
end
return table.concat(out)
"""

# KEYS: agents, leases, version, changes, loads, suspects, holders. ARGV: now ms, stream maxlen,
# reason, only-if-expired ('1'/'0'), agent ids... A removed agent's session marks go with it
# (node.view.suspects; every replica drops its own when it applies the tombstone). Returns a flat list {agent_id, version, ...} of the removed ones.
# The tombstone keeps the record's allowed_callers (its JSON array: caller patterns hold no
# brackets), so watchers who could not see the agent do not see it go either. The record's own
# list is the one followed by semantic_fallback (the model's order): each capability has one too,
# before it, and a card's params may hold one after; a record where it is not found is seen by
# admins and peers only.
DELETE = """
local out = {}
for i = 5, #ARGV do
  local id = ARGV[i]
  local ok = true
  if ARGV[4] == '1' then
    local score = redis.call('ZSCORE', KEYS[2], id)
    ok = (score ~= false) and tonumber(score) <= tonumber(ARGV[1])
  end
  local rec = ok and redis.call('HGET', KEYS[1], id)
  if rec then
    local acl = string.match(rec, '"allowed_callers":(%b[]),"semantic_fallback":') or '["admin"]'
    redis.call('HDEL', KEYS[1], id)
    redis.call('HDEL', KEYS[5], id)
    redis.call('HDEL', KEYS[6], id)
    redis.call('HDEL', KEYS[7], id)
    redis.call('ZREM', KEYS[2], id)
    local v = redis.call('INCR', KEYS[3])
    redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], v .. '-0',
               'kind', 'delete', 'agent_id', id, 'at', ARGV[1], 'reason', ARGV[3], 'acl', acl)
    out[#out + 1] = id
    out[#out + 1] = v
  end
end
return out
"""

__all__ = ["DELETE", "REGISTER", "RENEW", "UPDATE"]
