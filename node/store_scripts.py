"""The Lua scripts behind :class:`node.store.RegionStore`: every mutation of a region is one of them.

Each runs atomically in Redis, so a change is in the records, the lease set, the region version
and the change stream together or in none of them (the transactional outbox of ``node.store``).
Every key a script touches carries the region's hash tag, so each stays single-slot on Redis
Cluster. Only Redis 6.2 commands. The record JSON a script writes starts with its version
(``{"version":N,…``): ``node.store.stored_version`` reads it back without parsing the record, and
``UPDATE`` compares it. This module does no I/O; the store registers the scripts.
"""

from __future__ import annotations

# KEYS: agents, leases, version, changes. ARGV: agent_id, body (record JSON without version),
# lease expiry ms, now ms, stream maxlen. Returns {version, 1 if the agent was not stored}.
REGISTER = """
local v = redis.call('INCR', KEYS[3])
local rec = '{"version":' .. v .. ',' .. string.sub(ARGV[2], 2)
local created = redis.call('HSET', KEYS[1], ARGV[1], rec)
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], v .. '-0',
           'kind', 'upsert', 'agent_id', ARGV[1], 'at', ARGV[4], 'record', rec)
return {v, created}
"""

# KEYS: agents, leases, version, changes. ARGV: agent_id, expected version ('' = lease only),
# body, new lease expiry ms ('' = keep), now ms, stream maxlen, require a live lease ('1'/'0').
# Returns {0} unknown, {1, version} lease moved, {2, version} changed, {-1, current} conflict.
UPDATE = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return {0} end
if ARGV[7] == '1' then
  local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
  if (not score) or tonumber(score) <= tonumber(ARGV[5]) then return {0} end
end
local cv = tonumber(string.match(cur, '^{"version":(%d+),'))
if ARGV[2] == '' then
  if ARGV[4] ~= '' then redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1]) end
  return {1, cv}
end
if cv ~= tonumber(ARGV[2]) then return {-1, cur} end
local v = redis.call('INCR', KEYS[3])
local rec = '{"version":' .. v .. ',' .. string.sub(ARGV[3], 2)
redis.call('HSET', KEYS[1], ARGV[1], rec)
if ARGV[4] ~= '' then redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1]) end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], v .. '-0',
           'kind', 'status', 'agent_id', ARGV[1], 'at', ARGV[5], 'record', rec)
return {2, v}
"""

# KEYS: agents, leases, version, changes. ARGV: now ms, stream maxlen, reason, only-if-expired
# ('1'/'0'), agent ids... Returns a flat list {agent_id, version, ...} of the removed ones.
# The tombstone keeps the record's allowed_callers (its JSON array: caller patterns hold no
# brackets), so watchers who could not see the agent do not see it go either.
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
    local acl = string.match(rec, '"allowed_callers":(%b[])') or '[]'
    redis.call('HDEL', KEYS[1], id)
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

# KEYS: leader. ARGV: node id, ttl ms. Returns 1 when this node holds (or now took) the lease.
ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS: leader. ARGV: node id. Gives the lease up only if this node holds it; returns 1 if it did.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


__all__ = ["ACQUIRE", "DELETE", "REGISTER", "RELEASE", "UPDATE"]
