// Agent-Reach console: an admin's actions on one agent (drain, status, weight, deregister, revoke
// its tokens), each confirmed in the page before it is sent, and the confirmation dialog they and a
// sign-in from a link share. The node records each action in its decision log, which the agent's
// page shows. Loaded after app.js, whose helpers (h, $, api, notice, views …) it uses.
'use strict';

const STATUSES = ['ready', 'degraded', 'busy', 'draining', 'unready'];
const MAX_WEIGHT = 10000;

// Ask in the page; resolves true when confirmed (Escape or the cancel button: false).
function confirmDialog({id, title, body, ok, cancel = 'Cancel', danger = false}) {
  const dialog = $('#confirm');
  if (dialog.open) dialog.close('');
  dialog.dataset.purpose = id;
  $('#confirm-title').textContent = title;
  $('#confirm-body').replaceChildren(...body);
  const okButton = $('#confirm-ok');
  okButton.textContent = ok;
  okButton.className = danger ? 'danger' : 'primary';
  $('#confirm-cancel').textContent = cancel;
  return new Promise((resolve) => {
    dialog.addEventListener('close', () => resolve(dialog.returnValue === 'ok'), {once: true});
    dialog.returnValue = '';
    dialog.showModal();
    $('#confirm-cancel').focus();  // the safe choice is the default one
  });
}

// The actions an admin may take on a local agent; for another region's agent, where to take them.
function actionsPanel(record) {
  if (!state.claims || state.claims.role !== 'admin') return null;
  const panel = h('div', {class: 'panel', id: 'actions'}, h('h3', {text: 'Actions'}));
  if (record.region !== homeRegion()) {
    const link = $(`#region-switch a[data-region="${CSS.escape(record.region)}"]`);
    panel.append(h('div', {class: 'empty'}, `Region ${record.region} keeps this agent: act on it in that region's console`,
      link ? h('span', {}, ' (', h('a', {href: link.href, text: `${record.region} ↗`,
        onclick: (event) => { event.preventDefault(); link.click(); }}), ')') : null, '.'));
    return panel;
  }
  const reason = h('input', {type: 'text', id: 'action-reason', maxlength: 200,
    placeholder: 'Reason, for the decision log (optional)'});
  const status = h('select', {id: 'action-status'},
    STATUSES.map((s) => h('option', {value: s, text: s, selected: s === record.status})));
  const weight = h('input', {type: 'number', id: 'action-weight', min: 0, max: MAX_WEIGHT, step: 1, value: record.weight});
  const button = (id, text, onclick, tone) => h('button', {type: 'button', id, class: tone || null, text, onclick});
  const why = () => reason.value.trim();
  // The record as the page holds it when the button is pressed (the watch may have changed it since).
  const now = () => (views.agent.record && views.agent.record.agent_id === record.agent_id ? views.agent.record : record);
  panel.append(h('div', {class: 'actions'},
    h('div', {class: 'action-row'},
      button('action-drain', 'Drain', () => setStatus(now(), 'draining', why()), 'warn'),
      h('span', {class: 'sub', text: 'no new calls are routed to it; calls in flight finish'})),
    h('div', {class: 'action-row'}, h('label', {for: 'action-status', text: 'Status'}), status,
      button('action-set-status', 'Set status', () => setStatus(now(), status.value, why()))),
    h('div', {class: 'action-row'}, h('label', {for: 'action-weight', text: 'Weight'}), weight,
      button('action-set-weight', 'Set weight', () => setWeight(now(), weight.value, why()))),
    h('div', {class: 'action-row'},
      button('action-revoke', 'Revoke its tokens', () => revokeTokens(now(), why()), 'danger'),
      button('action-deregister', 'Deregister', () => deregister(now(), why()), 'danger')),
    h('div', {class: 'action-row'}, reason)));
  return panel;
}

// Confirm, send, say what happened; then `after` (the page read again, by default).
async function act({id, title, body, ok, danger, method, path, payload, done, after}) {
  if (!await confirmDialog({id, title, body, ok, danger})) {
    notice(`Not done: ${title.replace(/\?$/, '')}.`, 'idle');
    return;
  }
  let answer;
  try {
    answer = await api(path, {method, payload});
  } catch (error) {
    if (error.status !== 401) notice(`${title.replace(/\?$/, '')} failed: ${error.message}`, 'bad');
    return;
  }
  notice(done(answer), 'ok');
  if (after) after(); else if (state.view === 'agent') views.agent.load();
}

const agentPath = (record) => `/v1/admin/agents/${encodeURIComponent(record.agent_id)}`;
const withReason = (path, reason) => reason ? `${path}?reason=${encodeURIComponent(reason)}` : path;
const line = (...parts) => h('p', {}, ...parts);

function setStatus(record, status, reason) {
  const draining = status === 'draining';
  return act({
    id: 'status', title: `Set the status of ${record.agent_id} to ${status}?`, ok: draining ? 'Drain' : `Set ${status}`,
    body: [line('Its status is ', h('b', {text: record.status}), ' now.'),
      line(['ready', 'degraded', 'busy'].includes(status) ? 'It can be routed to with this status.'
        : 'With this status no new calls are routed to it; calls in flight finish.'),
      line("It holds until the agent names a status itself (a heartbeat with one, or registering again); ",
        'to keep it out for good, revoke its tokens and deregister it.')],
    method: 'PATCH', path: agentPath(record), payload: {status, ...(reason ? {reason} : {})},
    done: (answer) => answer.changed ? `${record.agent_id}: status ${record.status} → ${answer.status} (version ${answer.version}).`
      : `${record.agent_id} had status ${answer.status} already.`,
  });
}

function setWeight(record, value, reason) {
  const weight = Number(value);
  if (value === '' || !Number.isInteger(weight) || weight < 0 || weight > MAX_WEIGHT) {
    notice(`The weight must be a whole number from 0 to ${MAX_WEIGHT}.`, 'bad');
    return null;
  }
  return act({
    id: 'weight', title: `Set the weight of ${record.agent_id} to ${weight}?`, ok: `Set weight ${weight}`,
    body: [line('Its weight is ', h('b', {text: String(record.weight)}), ' now; calls are shared among agents in ',
      'proportion to their weights', weight === 0 ? ', so with 0 it gets none.' : '.')],
    method: 'PATCH', path: agentPath(record), payload: {weight, ...(reason ? {reason} : {})},
    done: (answer) => answer.changed ? `${record.agent_id}: weight ${record.weight} → ${answer.weight} (version ${answer.version}).`
      : `${record.agent_id} had weight ${answer.weight} already.`,
  });
}

function deregister(record, reason) {
  return act({
    id: 'deregister', title: `Deregister ${record.agent_id}?`, ok: 'Deregister', danger: true,
    body: [line(`Its record is removed from region ${record.region} and its peers; no call is routed to it any more.`),
      line('If it still runs it registers again at its next heartbeat: revoke its tokens first to keep it out.')],
    method: 'DELETE', path: withReason(agentPath(record), reason),
    done: (answer) => `${record.agent_id} was deregistered (version ${answer.version}).`,
    after: () => { location.hash = '#/agents'; },
  });
}

function revokeTokens(record, reason) {
  return act({
    id: 'revoke', title: `Revoke every token of ${record.agent_id}?`, ok: 'Revoke its tokens', danger: true,
    body: [line('Every agent token issued for ', h('b', {text: record.agent_id}), ' until now is refused, in this ',
      'region and its peers: its heartbeats fail and its lease runs out.'),
      line('It comes back only with a new token (', h('code', {text: `agent-reach token issue --agent ${record.agent_id}`}), ').')],
    method: 'POST', path: withReason(`${agentPath(record)}/revoke-tokens`, reason),
    done: (answer) => `${record.agent_id}: tokens issued until ${stamp(answer.issued_until_s * 1000)} are refused`
      + (answer.peers.length ? ` here and in ${answer.peers.join(', ')}.` : '.'),
  });
}
