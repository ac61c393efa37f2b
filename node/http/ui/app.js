// Agent-Reach console: plain JavaScript against this node's v1 API, with the operator's token.
// No framework, no build step, nothing from another origin (the page's CSP forbids it anyway).
// Everything shown comes from the API with the token, so the node's visibility rules apply.
'use strict';

const TOKEN_KEY = 'agent-reach.console.token';
const POLL_MS = 3000;
const MAX_RECENT = 12;

const state = {
  token: null,
  claims: null,
  node: null,           // GET /v1/regions
  ready: null,          // GET /readyz status
  agents: new Map(),    // "region/agent_id" -> {record, seq}
  tombstones: new Map(),// "region/agent_id" -> {version, seq}
  breakers: new Map(),  // agent_id -> {state, error_factor}
  recent: [],           // the last changes seen on the watch
  seq: 0,               // one per applied watch event
  listed: false,
  watch: null,          // AbortController of the open /v1/watch
  live: 'connecting',
  flash: new Set(),
  view: null,
  timers: [],
  viewTimer: null,      // the open view's own refresh (the agent page's probes)
  skew: 0,              // the node's clock minus this browser's, from the leases events
  leases: new Map(),    // agent_id -> lease end (ms) of this region's agents, from the leases events
};

// -- small helpers ---------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === 'class') el.className = value;
    else if (name === 'text') el.textContent = value;
    else if (name.startsWith('on')) el.addEventListener(name.slice(2), value);
    else if (name === 'dataset') Object.assign(el.dataset, value);
    else el.setAttribute(name, value === true ? '' : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const $ = (selector) => document.querySelector(selector);
const key = (region, agentId) => `${region}/${agentId}`;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function ago(ms) {
  if (ms === null || ms === undefined) return '—';
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

// Full date and time, local: "2026-12-04 13:05:09" (the title carries UTC, ISO 8601).
function stamp(ms) {
  const d = new Date(ms);
  const two = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())} ${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`;
}

function stampCell(ms) {
  return h('td', {class: 'mono nowrap', text: stamp(ms), title: new Date(ms).toISOString()});
}

// The node's clock, as far as this page can tell (leases are compared with it, not with the browser's).
const serverNow = () => Date.now() + state.skew;
const homeRegion = () => state.node && state.node.region;

function pill(text, tone) { return h('span', {class: `pill ${tone || ''}`, text}); }

function decodeClaims(token) {
  try {
    const part = token.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
    return JSON.parse(atob(part + '='.repeat((4 - part.length % 4) % 4)));
  } catch (e) {
    return null;
  }
}

// -- the token -------------------------------------------------------------------------------

// A signed-in link carries the token in the fragment (#token=…, #/agents&token=…), which browsers
// never send to a server. Take it out of the address bar at once, keeping the view it names.
function takeLinkToken() {
  const parts = location.hash.replace(/^#/, '').split('&');
  const found = parts.find((part) => part.startsWith('token='));
  if (found === undefined) return null;
  const rest = parts.filter((part) => !part.startsWith('token=')).join('&');
  history.replaceState(null, '', location.pathname + location.search + '#' + (rest || '/'));
  try { return decodeURIComponent(found.slice('token='.length)) || null; } catch (e) { return null; }
}

function who(token) {
  const claims = decodeClaims(token);
  return claims ? `${claims.sub} (${claims.role})` : 'an unreadable token';
}

// A link signs this tab in only when it has no session (or the link's token is the one in use);
// a tab signed in with another token asks first, so a link cannot switch a session silently.
// Resolves true when the session changed.
async function adoptLinkToken(token) {
  if (!token) return false;
  const current = sessionStorage.getItem(TOKEN_KEY);
  if (!current) { sessionStorage.setItem(TOKEN_KEY, token); return true; }
  if (current === token) return false;
  const switchTo = await confirmDialog({
    id: 'switch-session', title: 'Switch to another token?',
    body: [h('p', {}, 'The link you opened carries a token for ', h('b', {text: who(token)}), '.'),
      h('p', {}, 'This tab is signed in as ', h('b', {text: who(current)}), '. Keep that session, or sign in with the ',
        "link's token instead?")],
    ok: "Sign in with the link's token", cancel: 'Keep my session'});
  if (!switchTo) { notice("Kept this tab's session; the link's token was not used."); return false; }
  sessionStorage.setItem(TOKEN_KEY, token);
  return true;
}

function signIn(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  start();
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  stop();
  state.token = null;
  showSignIn(message);
}

function showSignIn(message) {
  $('#app').hidden = true;
  $('#signin').hidden = false;
  const error = $('#signin-error');
  error.hidden = !message;
  error.textContent = message || '';
  $('#signin-token').focus();
}

// -- the API ---------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

async function api(path, {method = 'GET', payload} = {}) {
  // Signed out meanwhile (a poll half done): nothing to send, and no 401 to provoke.
  if (!state.token) throw new ApiError(0, {message: 'signed out'});
  const headers = {Authorization: `Bearer ${state.token}`};
  if (payload !== undefined) headers['Content-Type'] = 'application/json';
  const response = await fetch(path, {method, headers, cache: 'no-store',
    body: payload === undefined ? undefined : JSON.stringify(payload)});
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (response.status === 401) {
    signOut(`The node refused the token: ${(body && body.message) || 'unauthorized'}`);
    throw new ApiError(401, body);
  }
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

function banner(message) {
  const el = $('#banner');
  el.hidden = !message;
  el.textContent = message || '';
}

// A short line under the tabs saying what an action did (or why it failed); it stays until the next.
function notice(message, tone) {
  const el = $('#notice');
  el.hidden = !message;
  el.className = `notice ${tone || 'ok'}`;
  el.textContent = message || '';
}

// -- data: the list, the region, breakers ----------------------------------------------------

async function loadAgents() {
  const since = state.seq;
  const list = await api('/v1/agents?scope=global');
  const next = new Map();
  for (const record of list.agents) {
    const k = key(record.region, record.agent_id);
    const dead = state.tombstones.get(k);
    if (dead && dead.version >= record.version) continue;
    next.set(k, {record, seq: 0});
  }
  // Changes the watch applied while the list was on its way are newer than the list.
  for (const [k, entry] of state.agents) {
    if (entry.seq > since) next.set(k, entry);
  }
  for (const [k, dead] of state.tombstones) {
    if (dead.seq > since) next.delete(k);
  }
  state.agents = next;
  state.listed = true;
}

async function loadRegion() {
  try {
    state.node = await api('/v1/regions');
    const breakers = await api('/v1/breakers');
    state.breakers = new Map(breakers.breakers.map((b) => [b.agent_id, b]));
    banner(null);
  } catch (error) {
    if (error.status !== 401) banner(`Cannot read the node: ${error.message}`);
  }
  try {
    const ready = await fetch('/readyz', {cache: 'no-store'});
    state.ready = ready.ok ? 'ready' : 'unready';
  } catch (e) {
    state.ready = 'unreachable';
  }
}

// -- live updates: /v1/watch over fetch() ----------------------------------------------------

// EventSource cannot send an Authorization header, so the stream is read with fetch().
async function watchLoop() {
  let backoff = 500;
  while (state.token) {
    const controller = new AbortController();
    state.watch = controller;
    try {
      // leases=true: lease renewals too (they are no change), so a heartbeating agent stays routable here.
      const response = await fetch('/v1/watch?leases=true', {headers: {Authorization: `Bearer ${state.token}`},
        signal: controller.signal, cache: 'no-store'});
      if (response.status === 401) { signOut('The node refused the token on /v1/watch'); return; }
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = '';
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buffer += value.replace(/\r\n/g, '\n');
        let end;
        while ((end = buffer.indexOf('\n\n')) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          await onEvent(parseEvent(block));
          backoff = 500;
        }
      }
    } catch (error) {
      if (controller.signal.aborted) return;
    }
    setLive('off');
    await sleep(backoff);
    backoff = Math.min(backoff * 2, 10000);
  }
}

function parseEvent(block) {
  const event = {event: 'message', data: ''};
  for (const line of block.split('\n')) {
    if (!line || line.startsWith(':')) continue;
    const colon = line.indexOf(':');
    const name = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
    if (name === 'data') event.data += (event.data ? '\n' : '') + value;
    else event[name] = value;
  }
  return event;
}

async function onEvent(event) {
  if (event.event === 'hello') {
    setLive('on');
    // (Re)connected: what happened while the stream was down is read from the list.
    try { await loadAgents(); } catch (error) { if (error.status !== 401) banner(`Cannot list agents: ${error.message}`); }
    render();
  } else if (event.event === 'change' && event.data) {
    applyChange(JSON.parse(event.data));
    render();
  } else if (event.event === 'leases' && event.data) {
    const data = JSON.parse(event.data);
    state.skew = data.now_ms - Date.now();
    for (const [agentId, lease] of Object.entries(data.leases)) state.leases.set(agentId, lease);
    render();
  } else if (event.event === 'overflow') {
    setLive('off');
  } else if (event.event === 'revoked') {
    signOut('The token was revoked; sign in with another one.');
  } else if (event.event === 'expired') {
    signOut('The token has expired; sign in with another one.');
  }
}

function applyChange(change) {
  const k = key(change.region, change.agent_id);
  const current = state.agents.get(k);
  state.seq += 1;
  if (change.kind === 'delete') {
    if (!current || change.version >= current.record.version) {
      state.agents.delete(k);
      if (change.region === homeRegion()) state.leases.delete(change.agent_id);
      state.tombstones.set(k, {version: change.version, seq: state.seq});
    }
  } else if (change.record) {
    if (!current || change.record.version >= current.record.version) {
      // The record carries its lease as of this change; a renewal heard before it may be of a
      // registration it replaced.
      if (change.region === homeRegion() && change.kind === 'upsert') state.leases.delete(change.agent_id);
      state.agents.set(k, {record: change.record, seq: state.seq});
      state.tombstones.delete(k);
      state.flash.add(k);
    }
  }
  state.recent.unshift(change);
  state.recent.length = Math.min(state.recent.length, MAX_RECENT);
}

function setLive(mode) {
  state.live = mode;
  const el = $('#live');
  el.classList.toggle('on', mode === 'on');
  el.classList.toggle('off', mode === 'off');
  $('#live-text').textContent = mode === 'on' ? 'live' : mode === 'off' ? 'reconnecting' : 'connecting';
}

// -- what an agent looks like ----------------------------------------------------------------

// A record's lease as the API reads it: the record's, or a later renewal the watch told of.
function leaseEnd(record) {
  return Math.max(record.lease_expires_at_ms, state.leases.get(record.agent_id) || 0);
}

function routable(record) {
  const leased = record.region !== homeRegion() || leaseEnd(record) > serverNow();
  return record.live && record.ready && ['ready', 'degraded', 'busy'].includes(record.status) && leased;
}

function leaseText(record) {
  return `in ${ago(leaseEnd(record) - serverNow())}`;
}

function statusPill(record) {
  const tone = {ready: 'ok', degraded: 'warn', busy: 'warn', draining: 'idle', unready: 'bad'}[record.status];
  return pill(record.status, tone);
}

function probesCell(record) {
  const probes = [];
  if (record.liveness_probe) probes.push(pill(record.live ? 'live' : 'not live', record.live ? 'ok' : 'bad'));
  if (record.readiness_probe) probes.push(pill(record.ready ? 'ready' : 'not ready', record.ready ? 'ok' : 'bad'));
  if (!probes.length) probes.push(h('span', {class: 'sub', text: 'no probes'}));
  return h('div', {}, probes, record.probe_error ? h('div', {class: 'sub error', text: record.probe_error}) : null);
}

function loadCell(record) {
  const load = record.load || {};
  const limit = record.max_concurrency;
  const cell = h('div', {class: 'mono', text: `${load.inflight || 0}${limit ? ' / ' + limit : ''} in flight`},
    h('div', {class: 'sub', text: `${load.queued || 0} queued · ${Number(load.rps || 0).toFixed(1)} rps`}));
  if (limit) {
    const bar = h('span');
    bar.style.width = `${Math.min(100, Math.round(100 * (load.inflight || 0) / limit))}%`;
    cell.append(h('div', {class: 'bar'}, bar));
  }
  return cell;
}

// This node's breaker of the agent (remote ones too: this node's callers reach them).
function breakerPill(record) {
  const breaker = state.breakers.get(record.agent_id);
  if (!breaker || breaker.state === 'closed') {
    return breaker ? pill(`closed · ×${breaker.error_factor}`, 'warn') : pill('closed', 'ok');
  }
  return pill(breaker.state.replace('_', '-'), breaker.state === 'open' ? 'bad' : 'warn');
}

function localityPill(record) {
  const local = state.node && record.region === state.node.region;
  return h('div', {}, h('span', {class: 'mono', text: record.region}), ' ',
    pill(local ? 'local' : 'remote', local ? 'info' : ''));
}

// An agent id may wrap after each dot, never inside a part.
function agentLink(agentId, region) {
  const parts = agentId.split('.').flatMap((part, i) => i ? [h('wbr'), `.${part}`] : [part]);
  return h('a', {href: `#/agent/${encodeURIComponent(agentId)}${region ? '?region=' + encodeURIComponent(region) : ''}`,
    class: 'agent-id'}, parts);
}

// -- views -----------------------------------------------------------------------------------

const views = {
  overview: {
    mount(main) {
      main.append(h('div', {class: 'section-title'}, h('h2', {text: 'Regions'}),
        h('span', {class: 'muted', text: 'freshness and lag as this node sees its peers'})),
        h('div', {class: 'cards', id: 'region-cards'}),
        h('div', {class: 'section-title'}, h('h2', {text: 'Agents'})),
        h('div', {class: 'cards', id: 'agent-cards'}),
        h('div', {class: 'section-title'}, h('h2', {text: 'Recent changes'}),
          h('span', {class: 'muted', text: 'from the live watch'})),
        h('div', {class: 'panel', id: 'recent'}));
    },
    update() {
      const cards = $('#region-cards');
      cards.replaceChildren(...regionCards());
      const records = [...state.agents.values()].map((entry) => entry.record);
      const open = [...state.breakers.values()].filter((b) => b.state !== 'closed').length;
      const count = (text, value, note) => h('div', {class: 'card'}, h('h3', {text}),
        h('div', {class: 'big', text: String(value)}), note ? h('div', {class: 'sub', text: note}) : null);
      $('#agent-cards').replaceChildren(
        count('Visible agents', records.length, 'what this token may see, every region'),
        count('Routable', records.filter(routable).length, 'live, ready, leased, taking traffic'),
        count('Not routable', records.filter((r) => !routable(r)).length, 'draining, unready, failing probes'),
        count('Breakers open', open, 'this node, from call outcome reports'));
      const recent = $('#recent');
      if (!state.recent.length) {
        recent.replaceChildren(h('div', {class: 'empty', text: 'No changes since the console opened.'}));
        return;
      }
      recent.replaceChildren(h('table', {}, h('thead', {}, h('tr', {},
        ['Time', 'Change', 'Agent', 'Region', 'Version'].map((t) => h('th', {text: t})))),
      h('tbody', {}, state.recent.map((change) => h('tr', {},
        stampCell(change.at_ms),
        h('td', {}, pill(change.kind === 'delete' ? (change.reason || 'delete') : change.kind,
          change.kind === 'delete' ? 'bad' : 'info')),
        h('td', {}, agentLink(change.agent_id, change.region)),
        h('td', {class: 'mono', text: change.region}),
        h('td', {class: 'mono num', text: String(change.version)}))))));
    },
  },

  agents: {
    filter: {text: '', status: '', region: '', routable: false, group: ''},
    mount(main, params) {
      const f = this.filter;
      if (params.has('group')) f.group = GROUPINGS.has(params.get('group')) ? params.get('group') : '';
      const rerender = () => this.update();
      const text = h('input', {type: 'search', id: 'agent-filter', placeholder: 'Filter by id, name, capability or label…',
        value: f.text, oninput: (e) => { f.text = e.target.value; rerender(); }});
      const status = h('select', {id: 'status-filter', onchange: (e) => { f.status = e.target.value; rerender(); }},
        ['', 'ready', 'degraded', 'busy', 'draining', 'unready'].map((s) =>
          h('option', {value: s, text: s || 'any status', selected: s === f.status})));
      const region = h('select', {id: 'region-filter', onchange: (e) => { f.region = e.target.value; rerender(); }});
      const onlyRoutable = h('input', {type: 'checkbox', checked: f.routable,
        onchange: (e) => { f.routable = e.target.checked; rerender(); }});
      const group = h('select', {id: 'group-by', title: 'Group the agents', onchange: (e) => {
        f.group = e.target.value;
        history.replaceState(null, '', f.group ? `#/agents?group=${f.group}` : '#/agents');
        rerender();
      }}, [...GROUPINGS].map(([value, label]) => h('option', {value, text: label, selected: value === f.group})));
      main.append(h('div', {class: 'toolbar'}, text, status, region, group, h('label', {}, onlyRoutable, 'routable only'),
        h('span', {class: 'muted', id: 'agents-shown'})),
      h('div', {class: 'panel', id: 'agents-table'}));
      text.focus();
    },
    update() {
      const f = this.filter;
      const regionSelect = $('#region-filter');
      const regions = [...new Set([...state.agents.values()].map((e) => e.record.region))].sort();
      if (regionSelect.options.length !== regions.length + 1) {
        regionSelect.replaceChildren(h('option', {value: '', text: 'any region'}),
          ...regions.map((r) => h('option', {value: r, text: r, selected: r === f.region})));
      }
      const needle = f.text.trim().toLowerCase();
      const rows = [...state.agents.entries()]
        .filter(([, {record}]) => (!f.status || record.status === f.status) && (!f.region || record.region === f.region)
          && (!f.routable || routable(record)) && (!needle || haystack(record).includes(needle)))
        .sort(([, a], [, b]) => localFirst(a.record, b.record));
      $('#agents-shown').textContent = `${rows.length} of ${state.agents.size}`;
      const table = $('#agents-table');
      if (!rows.length) {
        table.replaceChildren(h('div', {class: 'empty', text: state.listed ? 'No agent matches.' : 'Loading…'}));
        return;
      }
      table.replaceChildren(h('table', {class: 'agents'}, h('thead', {}, h('tr', {},
        AGENT_COLUMNS.map(([t, wide]) => h('th', {text: t, class: wide ? 'wide' : null})))),
      groupedBodies(rows, f.group)));
      state.flash.clear();
    },
  },

  search: {
    query: '',
    mount(main, params) {
      this.query = params.get('q') || this.query;
      const input = h('input', {type: 'search', id: 'search-q', value: this.query,
        placeholder: 'What should the agent do? e.g. "translate a contract into German"'});
      const scope = h('select', {id: 'search-scope'}, ['global', 'local-first', 'local'].map((s) => h('option', {value: s, text: s})));
      const form = h('form', {class: 'toolbar', id: 'search-form', onsubmit: (e) => {
        e.preventDefault();
        this.query = input.value.trim();
        history.replaceState(null, '', `#/search?q=${encodeURIComponent(this.query)}`);
        this.run(scope.value);
      }}, input, scope, h('button', {type: 'submit', class: 'primary', text: 'Search'}));
      main.append(form, h('div', {id: 'search-meta', class: 'muted'}), h('div', {class: 'hits', id: 'hits'}));
      input.focus();
      if (this.query) this.run(scope.value);
    },
    async run(scope) {
      const hits = $('#hits');
      if (!this.query) { hits.replaceChildren(); return; }
      $('#search-meta').textContent = 'Searching…';
      try {
        const result = await api(`/v1/search?q=${encodeURIComponent(this.query)}&k=20&scope=${scope}`);
        $('#search-meta').replaceChildren(`${result.hits.length} agents · `, pill(`${result.mode} ranking`, 'info'),
          ` · ${result.took_ms.toFixed(1)} ms`);
        hits.replaceChildren(...(result.hits.length ? result.hits.map(searchHit)
          : [h('div', {class: 'empty', text: 'Nothing this token may see matches.'})]));
      } catch (error) {
        $('#search-meta').textContent = '';
        hits.replaceChildren(h('div', {class: 'empty error', text: `Search failed: ${error.message}`}));
      }
    },
    update() {},
  },

  agent: {
    mount(main, params, agentId) {
      this.agentId = agentId;
      this.region = params.get('region');
      this.record = null;
      main.append(h('div', {id: 'agent-page'}, h('div', {class: 'empty', text: 'Loading…'})));
      this.load();
      state.viewTimer = setInterval(() => this.loadProbes(), POLL_MS);
    },
    async load() {
      const id = encodeURIComponent(this.agentId);
      const page = $('#agent-page');
      let record;
      try {
        record = await api(`/v1/agents/${id}`);
      } catch (error) {
        page.replaceChildren(h('div', {class: 'empty error',
          text: error.status === 404 ? `No agent ${this.agentId} that this token may see.` : error.message}));
        return;
      }
      const [card, decisions] = await Promise.all([
        api(`/v1/agents/${id}/agent-card.json`).catch((error) => ({error: error.message})),
        api(`/v1/agents/${id}/decisions`).catch((error) => ({error: error.message, decisions: []}))]);
      if (state.view !== 'agent' || this.agentId !== record.agent_id) return;  // the page moved on meanwhile
      this.record = record;
      page.replaceChildren(agentPage(record, card, decisions));
      this.loadProbes();
    },
    async loadProbes() {
      const panel = $('#probes');
      if (!panel || !this.record) return;
      const record = this.record;
      if (!record.liveness_probe && !record.readiness_probe) {
        panel.replaceChildren(h('h3', {text: 'Probes over time'}), h('div', {class: 'empty', text: 'This agent registered no probes.'}));
        return;
      }
      let found;
      try {
        found = await api(`/v1/agents/${encodeURIComponent(record.agent_id)}/probes`);
      } catch (error) {
        found = {error: error.message};
      }
      if ($('#probes') === panel) panel.replaceChildren(h('h3', {text: 'Probes over time'}), probeHistory(record, found));
    },
    update() {
      if (!this.record) return;
      // A change on the watch (a probe's verdict, a status, an admin's action) redraws the record.
      const seen = state.agents.get(key(this.record.region, this.record.agent_id));
      if (seen && seen.record.version > this.record.version && $('#record-panel')) {
        this.record = seen.record;
        $('#record-panel').replaceWith(recordPanel(seen.record));
        $('#agent-status').replaceChildren(statusPill(seen.record));
      }
      // Renewals arrive on the watch too: the lease and routability read as the API reads them.
      const record = this.record;
      const lease = $('#agent-lease');
      if (lease) lease.textContent = record.region === homeRegion() ? `ends ${leaseText(record)}` : `kept by its home region, ${record.region}`;
      const verdict = $('#agent-routable');
      if (verdict) verdict.replaceChildren(routable(record) ? pill('routable', 'ok') : pill('not routable', 'bad'));
    },
  },
};

const GROUPINGS = new Map([['', 'no grouping'], ['capability', 'by capability'], ['namespace', 'by namespace → group']]);
// [title, wide]: wide columns give way below 860 px (the agent's page shows them).
const AGENT_COLUMNS = [['Agent'], ['Region'], ['Status'], ['Probes', true], ['Load', true], ['Breaker', true],
  ['Capabilities'], ['Lease']];

// The table's bodies: one, or one per group with a heading row saying how many agents, how many routable.
// By capability an agent is listed under each of its capabilities; by namespace, under namespace → group
// (the first two parts of its id).
function groupedBodies(rows, grouping) {
  if (!grouping) return [h('tbody', {}, rows.map(([k, {record}]) => agentRow(k, record)))];
  const groups = new Map();
  const add = (name, row) => { if (!groups.has(name)) groups.set(name, []); groups.get(name).push(row); };
  for (const row of rows) {
    const record = row[1].record;
    if (grouping === 'capability') {
      const names = [...new Set(record.capabilities.map((c) => c.name))];
      (names.length ? names : ['(no capability)']).forEach((name) => add(name, row));
    } else {
      const [namespace, group] = record.agent_id.split('.');
      add(`${namespace}/${group}`, row);
    }
  }
  const bodies = [];
  let lastNamespace = null;
  for (const name of [...groups.keys()].sort()) {
    const members = groups.get(name);
    const count = `${members.length} agent${members.length === 1 ? '' : 's'} · ${members.filter(([, e]) => routable(e.record)).length} routable`;
    const heads = [];
    if (grouping === 'namespace') {
      const [namespace, group] = name.split('/');
      if (namespace !== lastNamespace) {
        const inNamespace = [...groups.entries()].filter(([other]) => other.startsWith(`${namespace}/`));
        heads.push(h('tr', {class: 'group-head namespace', dataset: {namespace}}, h('th', {colspan: AGENT_COLUMNS.length},
          h('span', {class: 'mono', text: namespace}), ' ', h('span', {class: 'sub', text: `namespace · ${inNamespace.length} group${inNamespace.length === 1 ? '' : 's'}`}))));
        lastNamespace = namespace;
      }
      heads.push(h('tr', {class: 'group-head'}, h('th', {colspan: AGENT_COLUMNS.length},
        h('span', {class: 'mono', text: `${namespace} → ${group}`}), ' ', h('span', {class: 'sub', text: count}))));
    } else {
      heads.push(h('tr', {class: 'group-head'}, h('th', {colspan: AGENT_COLUMNS.length},
        h('span', {class: 'chip', text: name}), ' ', h('span', {class: 'sub', text: count}))));
    }
    bodies.push(h('tbody', {dataset: {group: name}}, heads, members.map(([k, {record}]) => agentRow(k, record))));
  }
  return bodies;
}

function haystack(record) {
  return [record.agent_id, record.display_name, record.description, record.region,
    ...record.capabilities.map((c) => c.name), ...Object.entries(record.labels || {}).map(([k, v]) => `${k}=${v}`)]
    .join(' ').toLowerCase();
}

function localFirst(a, b) {
  const home = state.node && state.node.region;
  return (a.region !== home) - (b.region !== home) || a.region.localeCompare(b.region) || a.agent_id.localeCompare(b.agent_id);
}

function agentRow(k, record) {
  return h('tr', {class: `clickable${state.flash.has(k) ? ' flash' : ''}`, dataset: {agentId: record.agent_id, region: record.region},
    onclick: () => { location.hash = `#/agent/${encodeURIComponent(record.agent_id)}?region=${encodeURIComponent(record.region)}`; }},
  h('td', {}, agentLink(record.agent_id, record.region),
    record.display_name && record.display_name !== record.agent_id ? h('div', {class: 'sub', text: record.display_name}) : null),
  h('td', {}, localityPill(record)),
  h('td', {}, statusPill(record), routable(record) ? null : h('div', {class: 'sub', text: 'not routable'})),
  h('td', {class: 'wide'}, probesCell(record)),
  h('td', {class: 'wide'}, loadCell(record)),
  h('td', {class: 'wide'}, breakerPill(record)),
  h('td', {}, record.capabilities.map((c) => h('span', {class: 'chip', text: `${c.name}@${c.version}`}))),
  record.region === homeRegion() ? h('td', {class: 'mono sub lease nowrap', text: leaseText(record)})
    : h('td', {class: 'sub lease', text: '—', title: `its home region, ${record.region}, keeps the lease`}));
}

function regionCards() {
  const node = state.node;
  if (!node) return [h('div', {class: 'card muted', text: 'Loading…'})];
  const dl = (pairs) => h('dl', {}, pairs.flatMap(([k, v]) => [h('dt', {text: k}), h('dd', {}, v)]));
  const cards = [h('div', {class: 'card', dataset: {region: node.region}},
    h('h3', {}, h('span', {class: 'mono', text: node.region}), pill('this node', 'info'),
      pill(state.ready || '…', state.ready === 'ready' ? 'ok' : 'bad')),
    dl([['node', node.node_id], ['version', String(node.version)], ['agents', String(node.agents)],
      ['singleton duties', node.leader ? 'leader' : 'follower']]))];
  for (const peer of node.peers) {
    const behind = peer.events_behind;
    cards.push(h('div', {class: 'card', dataset: {region: peer.region}},
      h('h3', {}, h('span', {class: 'mono', text: peer.region}), peer.stale ? pill('stale', 'bad') : pill('fresh', 'ok'),
        peer.in_sync ? pill('in sync', 'ok') : pill('diverged', 'warn')),
      dl([['last heard', peer.heard_age_ms === null ? 'never' : `${ago(peer.heard_age_ms)} ago`],
        ['beacon age', peer.beacon_age_ms === null ? '—' : ago(peer.beacon_age_ms)],
        ['lag', behind === null || behind === undefined ? '—' : `${behind} event${behind === 1 ? '' : 's'}`],
        ['version seen', String(peer.seen_version)], ['agents', String(peer.agents)],
        ['anti-entropy runs', String(peer.anti_entropy_runs)]])));
  }
  if (!node.peers.length) {
    cards.push(h('div', {class: 'card muted'}, h('h3', {text: 'No peer regions'}),
      'This node runs without federation (or has no peers in its topology).'));
  }
  return cards;
}

function searchHit(hit) {
  const score = h('div', {class: 'score', text: hit.score.toFixed(3)}, h('small', {text: 'score'}));
  const match = hit.capability ? h('span', {class: 'chip', text: hit.capability}) : pill('description', '');
  return h('div', {class: 'hit', dataset: {agentId: hit.agent_id}}, score, h('div', {},
    h('div', {class: 'line'}, agentLink(hit.agent_id, hit.region), h('span', {class: 'muted', text: hit.display_name}),
      pill(hit.locality, hit.locality === 'local' ? 'info' : ''), hit.routable ? pill('routable', 'ok') : pill('not routable', 'bad')),
    h('div', {class: 'line sub'}, 'matched by ', pill(hit.capability ? 'capability' : 'description', 'info'), match,
      ` · semantic ${hit.vector_score === null ? '—' : hit.vector_score.toFixed(3)} · lexical ${hit.lexical_score.toFixed(3)}`
      + ` · ${hit.region}`)));
}

function recordPanel(record) {
  const kv = (pairs) => h('dl', {class: 'kv'}, pairs.flatMap(([k, v]) => [h('dt', {text: k}), h('dd', {}, v)]));
  const endpoints = Object.entries(record.endpoints).map(([name, url]) => h('div', {class: 'mono url', text: `${name}: ${url}`}));
  const labels = Object.entries(record.labels || {}).map(([k, v]) => h('span', {class: 'chip', text: `${k}=${v}`}));
  const local = record.region === homeRegion();
  const facts = kv([
    ['Display name', record.display_name || '—'], ['Description', h('span', {class: 'prose', text: record.description || '—'})],
    ['Region', localityPill(record)], ['Status', h('span', {}, statusPill(record), ' ',
      h('span', {id: 'agent-routable'}, routable(record) ? pill('routable', 'ok') : pill('not routable', 'bad')))],
    ['Probes', probesCell(record)], ['Load', loadCell(record)], ['Breaker', breakerPill(record)],
    ['Endpoints', h('div', {}, endpoints)], ['Transport', record.transport],
    ['Weight', h('span', {id: 'agent-weight', text: String(record.weight)})], ['Labels', labels.length ? h('div', {}, labels) : '—'],
    ['Allowed callers', record.allowed_callers.length ? record.allowed_callers.join(', ') : 'anyone'],
    ['Semantic fallback', record.semantic_fallback ? 'yes' : 'no'],
    ['Version', String(record.version)], ['Registered', h('span', {class: 'mono', text: stamp(record.registered_at_ms)})],
    ['Lease', h('span', {id: 'agent-lease', text: local ? `ends ${leaseText(record)}` : `kept by its home region, ${record.region}`})],
  ]);
  return h('div', {class: 'panel', id: 'record-panel', dataset: {version: String(record.version)}}, h('h3', {text: 'Record'}), facts);
}

function agentPage(record, card, decisions) {
  const capabilities = h('table', {}, h('thead', {}, h('tr', {}, ['Capability', 'Version', 'Description'].map((t) => h('th', {text: t})))),
    h('tbody', {}, record.capabilities.map((c) => h('tr', {}, h('td', {}, h('span', {class: 'chip', text: c.name})),
      h('td', {class: 'mono', text: c.version}), h('td', {class: 'prose', text: c.description || '—'})))));
  return h('div', {},
    h('div', {class: 'agent-head'}, h('a', {href: '#/agents', text: '← Agents'}), h('h1', {}, [...agentLink(record.agent_id).childNodes]),
      h('span', {id: 'agent-status'}, statusPill(record))),
    h('div', {class: 'grid2'},
      h('div', {class: 'stack'}, recordPanel(record),
        h('div', {class: 'panel'}, h('h3', {text: 'Capabilities'}), capabilities)),
      h('div', {class: 'stack'}, actionsPanel(record),
        h('div', {class: 'panel', id: 'probes'}, h('h3', {text: 'Probes over time'}), h('div', {class: 'empty', text: 'Loading…'})))),
    h('div', {class: 'panel wide-panel', id: 'decisions'}, h('h3', {text: 'Recent decisions and actions (this node)'}),
      decisionsTable(decisions)),
    h('div', {class: 'panel wide-panel'}, h('h3', {text: 'A2A agent card'}),
      h('pre', {class: 'json', text: card.error ? `Not available: ${card.error}` : JSON.stringify(card, null, 2)})));
}

// The probe results the region's leader kept: a strip per probe, oldest to newest, and the latest few.
function probeHistory(record, found) {
  if (found.error) return h('div', {class: 'empty', text: `Not available: ${found.error}`});
  if (!found.leader) {
    return h('div', {class: 'empty', text: `The region's leader runs the probes and keeps their results; this node (${found.node_id}) is not the leader.`});
  }
  if (!found.probes.length) return h('div', {class: 'empty', text: 'No probe has run yet.'});
  const strips = ['liveness', 'readiness'].filter((kind) => record[`${kind}_probe`]).map((kind) => {
    const results = found.probes.filter((p) => p.kind === kind).reverse();  // oldest first
    const passed = results.filter((p) => p.ok).length;
    return h('div', {class: 'probe-strip', dataset: {kind}},
      h('div', {class: 'probe-label'}, h('b', {text: kind}), h('span', {class: 'sub', text: ` ${passed} of ${results.length} passed`})),
      h('div', {class: 'ticks'}, results.map((p) => h('span', {class: `tick ${p.ok ? 'ok' : 'bad'}`,
        title: `${stamp(p.at_ms)} · ${p.ok ? 'passed' : 'failed'} · ${p.latency_ms} ms${p.error ? ' · ' + p.error : ''}`}))));
  });
  const latest = found.probes.slice(0, 8);
  return h('div', {}, h('div', {class: 'probe-strips'}, strips), h('div', {class: 'table-scroll'}, h('table', {class: 'probe-results'},
    h('thead', {}, h('tr', {}, ['Time', 'Probe', 'Result', 'Latency', 'Error'].map((t) => h('th', {text: t})))),
    h('tbody', {}, latest.map((p) => h('tr', {dataset: {ok: String(p.ok)}}, stampCell(p.at_ms), h('td', {text: p.kind}),
      h('td', {}, pill(p.ok ? 'passed' : 'failed', p.ok ? 'ok' : 'bad')), h('td', {class: 'mono num', text: `${p.latency_ms} ms`}),
      h('td', {class: 'sub prose', text: p.error || '—'})))))));
}

function decisionsTable(decisions) {
  if (decisions.error) return h('div', {class: 'empty', text: `Not available: ${decisions.error}`});
  if (!decisions.decisions.length) return h('div', {class: 'empty', text: 'No route decisions about this agent on this node yet.'});
  const result = (d) => {
    if (d.kind === 'outcome') {
      const latency = d.latency_ms !== undefined && d.latency_ms !== null ? ` · ${Math.round(d.latency_ms)} ms` : '';
      return pill(`${d.outcome}${latency}`, d.outcome === 'success' ? 'ok' : 'bad');
    }
    if (d.kind === 'admin') return pill(d.action.replace('_', ' '), 'warn');
    return pill(d.result || '—', d.result === 'ok' ? 'ok' : 'bad');
  };
  const detail = (d) => d.kind === 'admin' ? d.detail
    : [d.match, d.capability, d.score !== undefined && d.score !== null ? d.score.toFixed(3) : null, d.locality]
      .filter((x) => x !== null && x !== undefined).join(' · ') || d.detail || '—';
  return h('div', {class: 'table-scroll'}, h('table', {class: 'decisions'},
    h('thead', {}, h('tr', {}, ['Time', 'Kind', 'Caller', 'Result', 'Detail', 'Trace'].map((t) => h('th', {text: t})))),
    h('tbody', {}, decisions.decisions.map((d) => h('tr', {dataset: {kind: d.kind}},
      stampCell(d.at_ms),
      h('td', {}, pill(d.kind, d.kind === 'decision' ? 'info' : d.kind === 'admin' ? 'warn' : '')),
      h('td', {class: 'mono', text: d.caller || '—'}),
      h('td', {}, result(d)),
      h('td', {class: 'sub prose', text: detail(d)}),
      h('td', {class: 'mono sub trace', text: d.trace_id || '—'}))))));
}

// -- routing and the frame -------------------------------------------------------------------

function route() {
  if (state.viewTimer) { clearInterval(state.viewTimer); state.viewTimer = null; }
  const hash = location.hash.replace(/^#/, '') || '/';
  const [path, query] = hash.split('?');
  const params = new URLSearchParams(query || '');
  const parts = path.split('/').filter(Boolean);
  const main = $('#main');
  main.replaceChildren();
  let name = 'overview';
  if (parts[0] === 'agents') name = 'agents';
  else if (parts[0] === 'search') name = 'search';
  else if (parts[0] === 'agent' && parts[1]) name = 'agent';
  state.view = name;
  for (const tab of document.querySelectorAll('#tabs a')) {
    tab.classList.toggle('active', tab.dataset.view === name || (name === 'agent' && tab.dataset.view === 'agents'));
  }
  views[name].mount(main, params, parts[1] ? decodeURIComponent(parts[1]) : null);
  render();
}

function render() {
  if (!state.token || !state.view) return;
  $('#agents-count').textContent = state.listed ? String(state.agents.size) : '';
  const node = state.node;
  const facts = $('#node-facts');
  if (node) {
    const fact = (label, value) => h('span', {class: 'fact'}, `${label} `, h('b', {text: value}));
    facts.replaceChildren(fact('region', node.region), fact('version', String(node.version)),
      fact('node', node.node_id), fact('role', node.leader ? 'leader' : 'follower'));
    regionSwitch(node);
  }
  views[state.view].update();
}

// This region and a link to each peer region's console (the first of its node URLs in the topology).
// The token goes along in the link's fragment only when the link is followed, so the page never
// holds a link with a token in it; the peer's console signs in with it (that tab has no session there).
function regionSwitch(node) {
  const nav = $('#region-switch');
  const shape = JSON.stringify([node.region, node.peers.map((peer) => [peer.region, peer.stale, peer.node_urls])]);
  if (nav.dataset.shape === shape) return;
  nav.dataset.shape = shape;
  nav.hidden = !node.peers.length;  // one region: nowhere to switch to
  const links = [h('span', {class: 'region current', title: "this node's region", dataset: {region: node.region}, text: node.region})];
  for (const peer of node.peers) {
    const url = (peer.node_urls || []).find((candidate) => /^https?:\/\/[^\s]+$/i.test(candidate));
    if (!url) {
      links.push(h('span', {class: 'region muted', dataset: {region: peer.region}, title: 'no console address known', text: peer.region}));
      continue;
    }
    const base = `${url.replace(/\/+$/, '')}/ui/`;
    links.push(h('a', {class: `region${peer.stale ? ' stale' : ''}`, href: base, dataset: {region: peer.region},
      title: `${peer.region}'s console${peer.stale ? ' (stale: not heard from lately)' : ''}`,
      onclick: (event) => {
        if (event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey) return;
        event.preventDefault();
        location.href = `${base}#token=${encodeURIComponent(state.token)}`;
      }}, peer.region, h('span', {class: 'out', text: ' ↗'})));
  }
  nav.replaceChildren(...links);
}

function start() {
  state.token = sessionStorage.getItem(TOKEN_KEY);
  if (!state.token) { showSignIn(null); return; }
  state.claims = decodeClaims(state.token);
  $('#signin').hidden = true;
  $('#app').hidden = false;
  $('#whoami').textContent = state.claims ? `${state.claims.sub} · ${state.claims.role}` : 'token';
  setLive('connecting');
  state.skew = 0;
  route();
  const poll = async () => { await loadRegion(); render(); };
  poll();
  state.timers.push(setInterval(poll, POLL_MS));
  watchLoop();
}

function stop() {
  for (const timer of state.timers) clearInterval(timer);
  state.timers = [];
  if (state.watch) state.watch.abort();
  if (state.viewTimer) { clearInterval(state.viewTimer); state.viewTimer = null; }
  state.agents = new Map();
  state.leases = new Map();
  state.tombstones = new Map();
  state.recent = [];
  state.listed = false;
  state.view = null;
}

document.addEventListener('DOMContentLoaded', async () => {
  const linkToken = takeLinkToken();
  $('#signin-form').addEventListener('submit', (event) => {
    event.preventDefault();
    const token = $('#signin-token').value.trim();
    if (token) { $('#signin-token').value = ''; signIn(token); }
  });
  $('#signout').addEventListener('click', () => signOut(null));
  window.addEventListener('hashchange', async () => {
    const token = takeLinkToken();
    if (token !== null && await adoptLinkToken(token)) { stop(); start(); return; }
    if (state.token) route(); else start();
  });
  const hadSession = sessionStorage.getItem(TOKEN_KEY) !== null;
  if (!hadSession) await adoptLinkToken(linkToken);  // no session: the link signs this tab in
  start();
  if (hadSession && await adoptLinkToken(linkToken)) { stop(); start(); }
});
