//! The pages' scripts: constants, served inline and allowed by their SHA-256 (see
//! [`content_security_policy`](super::content_security_policy)); a new script must join [`ALL`].
//!
//! They set run strings with `textContent` only. The one markup they insert is the run page's own
//! fragment (`/runs/{id}/timeline`), parsed with `DOMParser` and swapped in by id.

/// Every inline script a page may carry.
pub const ALL: [&str; 2] = [INDEX_JS, RUN_JS];

/// The live index: follows `/runs/feed` (rows of other agents or channels than the page's filter are
/// skipped) and keeps the relative times current.
pub const INDEX_JS: &str = r#"
(function () {
  var root = document.getElementById('index');
  var rows = document.getElementById('rows');
  var wantAgent = root.dataset.agent || null, wantChannel = root.dataset.channel || null;
  function pad(n) { return (n < 10 ? '0' : '') + n; }
  function iso(ms) {
    var d = new Date(ms);
    return d.getUTCFullYear() + '-' + pad(d.getUTCMonth() + 1) + '-' + pad(d.getUTCDate()) + ' ' +
      pad(d.getUTCHours()) + ':' + pad(d.getUTCMinutes()) + ':' + pad(d.getUTCSeconds()) + 'Z';
  }
  function dur(ms) {
    ms = Math.max(0, ms);
    if (ms < 1000) return ms + ' ms';
    if (ms < 60000) return (ms / 1000).toFixed(1) + ' s';
    if (ms < 3600000) return Math.floor(ms / 60000) + ' m ' + pad(Math.floor(ms % 60000 / 1000)) + ' s';
    return Math.floor(ms / 3600000) + ' h ' + pad(Math.floor(ms % 3600000 / 60000)) + ' m';
  }
  function ago(ms) {
    var s = Math.floor(Math.max(0, Date.now() - ms) / 1000);
    if (s < 5) return 'just now';
    if (s < 60) return s + ' s ago';
    if (s < 3600) return Math.floor(s / 60) + ' min ago';
    if (s < 86400) return Math.floor(s / 3600) + ' h ago';
    return Math.floor(s / 86400) + ' d ago';
  }
  function timeEl(ms) {
    var t = document.createElement('time');
    t.className = 'ago'; t.dataset.ms = String(ms); t.title = iso(ms); t.textContent = ago(ms);
    return t;
  }
  function label(v) {
    if (!v.finished) return v.stop ? 'stopping (' + v.stop + ')' : 'live';
    if (v.provisional) return 'unfinished \u2014 no finish recorded';
    return v.status || 'finished';
  }
  function cls(v) {
    if (!v.finished) return v.stop ? 'stopping' : 'live';
    if (v.provisional) return 'warn';
    if (v.status === 'completed') return 'ok';
    if (v.status === 'stopped_soft' || v.status === 'stopped_hard') return 'stopped';
    return 'bad';
  }
  function el(tag, className, text) {
    var e = document.createElement(tag);
    if (className) e.className = className;
    if (text != null) e.textContent = String(text);
    return e;
  }
  function cell(tr, name, className) {
    var td = el('td', className); td.dataset.label = name; tr.appendChild(td); return td;
  }
  // The marks the server renders (html::marks), with the same words.
  function mark(box, cls, text, title) { var m = el('span', 'mark ' + cls, text); m.title = title; box.appendChild(m); }
  function marks(v) {
    if (!v.resumed && !v.effectsUnknown && !v.deliveryUnknown) return null;
    var box = el('span', 'marks');
    if (v.resumed) mark(box, 'mark-resumed', '\u21bb resumed', 'Resumed ' + (v.resumed === 1 ? 'once' : v.resumed + ' times') + ' after the process holding it ended');
    if (v.effectsUnknown) mark(box, 'mark-unknown', '\u26a0 effects unknown', 'Effects unknown: ' + (v.effectsUnknown === 1 ? '1 tool call' : v.effectsUnknown + ' tool calls') + ' in flight when a process ended; whether they took effect is not known');
    if (v.deliveryUnknown) mark(box, 'mark-delivery', '\u2709 delivery unknown', 'Delivery unknown: the process holding the run ended after its finishing gate, so whether its reply reached the channel is not known');
    return box;
  }
  function render(v) {
    var tr = document.createElement('tr');
    tr.id = 'run-' + v.id; tr.dataset.id = v.id;
    cell(tr, 'Status').appendChild(el('span', 'status st-' + cls(v), label(v)));
    var box = el('div'); cell(tr, 'Run', 'run').appendChild(box);
    var a = el('a', null, v.label || v.id); a.href = '/runs/' + encodeURIComponent(v.id); box.appendChild(a);
    var m = marks(v); if (m) box.appendChild(m);
    box.appendChild(el('div', 'sub', v.id));
    if (v.error) { var err = el('div', 'err', v.error); err.title = v.error; box.appendChild(err); }
    cell(tr, 'Agent').textContent = v.agent || '\u2014';
    cell(tr, 'Channel').textContent = v.channelId;
    var th = el('a', 'sub', v.threadKey); th.href = '/threads/' + encodeURIComponent(v.threadKey); th.title = "This thread's runs";
    cell(tr, 'Thread', 'col-thread').appendChild(th);
    cell(tr, 'Started').appendChild(timeEl(v.startedAt));
    cell(tr, 'Duration', 'num').textContent = dur((v.finishedAt || Date.now()) - v.startedAt);
    var fin = cell(tr, 'Finished');
    if (v.finishedAt != null) fin.appendChild(timeEl(v.finishedAt)); else fin.appendChild(el('span', 'muted', '\u2014'));
    cell(tr, 'Events', 'num').textContent = String(v.eventCount);
    return tr;
  }
  var es = new EventSource('/runs/feed');
  es.addEventListener('upsert', function (m) {
    var v = JSON.parse(m.data);
    if ((wantAgent && v.agent !== wantAgent) || (wantChannel && v.channelId !== wantChannel)) return;
    var old = document.getElementById('run-' + v.id);
    var tr = render(v);
    if (old) { rows.replaceChild(tr, old); } else { rows.insertBefore(tr, rows.firstChild); }
    var empty = document.getElementById('empty'); if (empty) empty.remove();
  });
  es.addEventListener('removed', function (m) {
    var v = JSON.parse(m.data);
    var old = document.getElementById('run-' + v.id); if (old) old.remove();
  });
  setInterval(function () {
    var times = document.querySelectorAll('time.ago');
    for (var i = 0; i < times.length; i++) times[i].textContent = ago(Number(times[i].dataset.ms));
  }, 15000);
})();
"#;

/// The live view: follows the run's stream from the last seeded seq (on the newest page), appends events
/// with their relative time, duration and details and follows the tail while scrolled to the bottom,
/// re-fetches the timeline as events arrive, ticks the "now" line, drives the Stop / Kill / Run again
/// buttons, and keeps the panels of calls awaiting approval with their Approve / Deny buttons.
pub const RUN_JS: &str = r#"
(function () {
  var root = document.getElementById('run');
  var id = root.dataset.id, token = root.dataset.token || '';
  var last = Number(root.dataset.lastSeq || 0);
  var count = Number(root.dataset.count || 0);
  var first = Number(root.dataset.first || 1);
  var range = document.getElementById('ev-range');
  var tail = root.dataset.tail === 'true';
  var list = document.getElementById('events');
  var statusEl = document.getElementById('status');
  var conn = document.getElementById('conn');
  var msg = document.getElementById('control-msg');
  var base = '/api/runs/' + encodeURIComponent(id);
  var tq = token ? 'token=' + encodeURIComponent(token) : '';
  var startedAt = Number(root.dataset.startedAt || 0);
  var MAX_ITEMS = 400;
  function str(v) { return v == null ? '' : (typeof v === 'string' ? v : JSON.stringify(v)); }
  function pad(n) { return (n < 10 ? '0' : '') + n; }
  function iso(ms) {
    var d = new Date(ms);
    return d.getUTCFullYear() + '-' + pad(d.getUTCMonth() + 1) + '-' + pad(d.getUTCDate()) + ' ' +
      pad(d.getUTCHours()) + ':' + pad(d.getUTCMinutes()) + ':' + pad(d.getUTCSeconds()) + 'Z';
  }
  // What an event carries, as the server lists it (live::event_fields).
  function fields(e) {
    return Object.keys(e).filter(function (k) { return k !== 'type' && k !== 'seq'; }).sort().map(function (k) {
      var v = e[k], label = k, text;
      if (k === 'summary' && e.type === 'tool_call') label = 'input';
      else if (k === 'summary' && e.type === 'tool_result') label = 'output';
      else if (k === 'at') label = 'time';
      var n = function (x) { return x === undefined ? '?' : JSON.stringify(x); };
      if (k === 'at' && typeof v === 'number' && Number.isInteger(v)) text = iso(v);
      else if (k === 'usage' && v && typeof v === 'object' && !Array.isArray(v)) text = n(v.inputTokens) + ' in / ' + n(v.outputTokens) + ' out';
      else if (typeof v === 'string') text = v;
      else text = JSON.stringify(v);
      return [label, text];
    });
  }
  function details(e) {
    var rows = fields(e);
    if (!rows.length) return null;
    var d = document.createElement('details'); d.className = 'ev-details';
    var s = document.createElement('summary'); s.textContent = 'details'; d.appendChild(s);
    var dl = document.createElement('dl');
    rows.forEach(function (r) {
      var dt = document.createElement('dt'); dt.textContent = r[0];
      var dd = document.createElement('dd'); dd.textContent = r[1];
      dl.appendChild(dt); dl.appendChild(dd);
    });
    d.appendChild(dl);
    return d;
  }
  function dur(ms) {
    ms = Math.max(0, ms);
    if (ms < 1000) return ms + ' ms';
    if (ms < 60000) return (ms / 1000).toFixed(1) + ' s';
    if (ms < 3600000) return Math.floor(ms / 60000) + ' m ' + pad(Math.floor(ms % 60000 / 1000)) + ' s';
    return Math.floor(ms / 3600000) + ' h ' + pad(Math.floor(ms % 3600000 / 60000)) + ' m';
  }
  function describe(e) {
    switch (e.type) {
      case 'run_meta': return ['run started', 'agent ' + str(e.agent) + ' \u00b7 model ' + str(e.model)];
      case 'input': return ['input (' + str(e.source) + ')', str(e.text)];
      case 'context': return ['context', str(e.text)];
      case 'assistant': return ['step ' + str(e.step) + ' \u00b7 assistant', str(e.text)];
      case 'tool_call': return ['step ' + str(e.step) + ' \u00b7 tool call ' + str(e.tool), str(e.summary)];
      case 'tool_result': return ['step ' + str(e.step) + ' \u00b7 tool result ' + str(e.tool) + ' ' + (e.ok === true ? 'ok' : 'failed'), str(e.summary)];
      case 'note': return ['note ' + str(e.kind), str(e.summary)];
      case 'stop_requested': var a = e.actor || {}; return ['stop requested (' + str(e.mode) + ')', 'by ' + str(a.kind) + ':' + str(a.id)];
      case 'resumed': return ['resumed', 'from generation ' + str(e.fromGeneration)];
      case 'run_failed': return ['run failed', str(e.message)];
      case 'answer': return ['answer', str(e.text)];
      case 'approval_requested': return ['step ' + str(e.step) + ' \u00b7 approval requested ' + str(e.tool), str(e.summary)];
      case 'approval_decided': return ['step ' + str(e.step) + ' \u00b7 ' + (e.decision === 'approve' ? 'approved' : 'denied') + ' ' + str(e.tool), 'by ' + str(e.who) + (e.note ? ': ' + str(e.note) : '')];
      default: return [str(e.type), JSON.stringify(e)];
    }
  }
  // Durations as the server computes them: a tool result closes its call, an assistant turn the model
  // call that began when the model got its input.
  var calls = {}, ready = null;
  function durationOf(e) {
    if (e.at == null) return null;
    var d = null;
    if (e.type === 'tool_call') { calls[e.callId] = e.at; return null; }
    if (e.type === 'tool_result' && calls[e.callId] != null) { d = e.at - calls[e.callId]; delete calls[e.callId]; }
    if (e.type === 'assistant' && ready != null) d = e.at - ready;
    if (['run_meta', 'input', 'context', 'tool_result', 'resumed', 'assistant'].indexOf(e.type) >= 0) ready = e.at;
    return d;
  }
  function span(cls, text) { var s = document.createElement('span'); s.className = cls; s.textContent = text; return s; }
  function render(e) {
    var d = describe(e), li = document.createElement('li');
    li.className = 'ev ev-' + String(e.type || 'other').replace(/[^A-Za-z0-9_]/g, '') + (e.effectsUnknown === true ? ' ev-unknown' : '');
    li.dataset.seq = e.seq == null ? '' : String(e.seq);
    if (typeof e.step === 'number') li.dataset.step = String(e.step);
    li.appendChild(span('seq', '#' + li.dataset.seq));
    li.appendChild(span('rel', e.at == null ? '' : '+' + dur(e.at - startedAt)));
    var head = span('head', ''); head.appendChild(span('kind', d[0]));
    var took = durationOf(e); if (took != null) head.appendChild(span('dur', dur(took)));
    li.appendChild(head); li.appendChild(span('body', d[1]));
    var more = details(e); if (more) li.appendChild(more);
    return li;
  }
  // The model turn that gave the answer (no tool call in its step) reads "final answer", as on the server.
  function markFinalAnswer() {
    var turns = list.querySelectorAll('li.ev-assistant');
    var turn = turns.length ? turns[turns.length - 1] : null;
    var step = turn && turn.dataset.step;
    if (!step || !/^[0-9]+$/.test(step)) return;
    if (list.querySelector('li.ev-tool_call[data-step="' + step + '"]')) return;
    turn.querySelector('.kind').textContent = 'final answer \u00b7 assistant';
  }
  var usage = JSON.parse(root.getAttribute('data-usage') || '{}');
  function addUsage(e) {
    var m = e.model == null ? '-' : String(e.model), u = usage[m] || [0, 0];
    usage[m] = [u[0] + (e.usage.inputTokens || 0), u[1] + (e.usage.outputTokens || 0)];
    document.getElementById('f-usage').textContent = Object.keys(usage).sort().map(function (k) {
      return k + ': ' + usage[k][0] + ' in / ' + usage[k][1] + ' out';
    }).join(' \u00b7 ');
  }
  function setStatus(text, cls) { statusEl.textContent = text; statusEl.className = 'status st-' + cls; }
  function statusClass(s) {
    if (s === 'completed') return 'ok';
    if (s === 'stopped_soft' || s === 'stopped_hard') return 'stopped';
    return 'bad';
  }
  function showError(text) {
    document.getElementById('error-text').textContent = text;
    document.getElementById('error-box').hidden = false;
  }
  // The timeline and the "now" line: one server renderer, re-fetched at most once a second.
  var refreshing = false, again = false, ended = false;
  function refresh() {
    if (refreshing) { again = true; return; }
    refreshing = true;
    fetch('/runs/' + encodeURIComponent(id) + '/timeline' + (tq ? '?' + tq : ''), { headers: { accept: 'text/html' } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) {
        if (text == null) return;
        var doc = new DOMParser().parseFromString(text, 'text/html');
        // A fragment fetched before the run's end may still show a "now": a finished run has none.
        (ended ? ['timeline'] : ['now-slot', 'timeline']).forEach(function (k) {
          var fresh = doc.getElementById(k), old = document.getElementById(k);
          if (fresh && old) old.replaceWith(document.importNode(fresh, true));
        });
      }, function () {})
      .then(function () {
        setTimeout(function () { refreshing = false; if (again) { again = false; refresh(); } }, 1000);
      });
  }
  var ranEl = document.getElementById('f-ran'), durEl = document.getElementById('f-duration');
  function tick() {
    var t = dur(Date.now() - startedAt);
    ranEl.textContent = t; durEl.textContent = t;
    var now = document.getElementById('now'), forEl = document.getElementById('now-for');
    if (now && forEl) forEl.textContent = dur(Date.now() - Number(now.dataset.since));
  }
  // Calls awaiting approval: one panel each (the markup of live::approval_item), wired to post the
  // decision; a panel goes when its call's approval_decided (or its result, a stop having ended the
  // wait) arrives, and every one when the run ends.
  var approvals = document.getElementById('approvals'), approvalList = document.getElementById('approval-list');
  function approvalPanels() { return Array.prototype.slice.call(approvalList.children); }
  function approvalItem(e) {
    var div = document.createElement('div'); div.className = 'approval'; div.dataset.callId = str(e.callId);
    var head = document.createElement('div'); head.className = 'approval-head';
    var what = document.createElement('span'); what.appendChild(document.createTextNode('\u270b '));
    var tool = document.createElement('b'); tool.className = 'approval-tool'; tool.textContent = str(e.tool); what.appendChild(tool);
    head.appendChild(what);
    head.appendChild(span('muted', (typeof e.step === 'number' ? 'step ' + e.step + ' \u00b7 ' : '') + 'call ' + str(e.callId)));
    div.appendChild(head);
    var input = document.createElement('pre'); input.className = 'approval-input'; input.textContent = str(e.summary); div.appendChild(input);
    var controls = document.createElement('div'); controls.className = 'approval-controls';
    var note = document.createElement('input'); note.type = 'text'; note.className = 'approval-note';
    note.maxLength = Number(approvals.dataset.noteMax || 2000); note.placeholder = 'Note (optional)'; note.setAttribute('aria-label', 'Note');
    controls.appendChild(note);
    [['approve', 'Approve', 'btn-primary approval-approve'], ['deny', 'Deny', 'btn-danger approval-deny']].forEach(function (b) {
      var button = document.createElement('button'); button.type = 'button'; button.className = b[2];
      button.dataset.decision = b[0]; button.textContent = b[1]; controls.appendChild(button);
    });
    var out = span('approval-msg', ''); out.setAttribute('role', 'status'); controls.appendChild(out);
    div.appendChild(controls);
    return div;
  }
  function decide(div, decision) {
    var buttons = div.querySelectorAll('button'), out = div.querySelector('.approval-msg');
    var enable = function (on) { for (var i = 0; i < buttons.length; i++) buttons[i].disabled = !on; };
    var body = { decision: decision }, note = div.querySelector('.approval-note').value;
    if (note) body.note = note;
    enable(false);
    call('POST', base + '/approvals/' + encodeURIComponent(div.dataset.callId), body, function (r, b) {
      if (r && r.ok) {
        out.textContent = (b.decision === 'approve' ? 'approved' : 'denied') + ' by ' + str(b.who);
        // The panel goes when the decision's event arrives: the controls' line keeps the answer.
        msg.textContent = 'call ' + div.dataset.callId + ' ' + out.textContent;
      }
      else if (r && r.status === 409) out.textContent = '409 decided already: ' + str(b.message || b.error || '');
      else enable(true);
    }, out);
  }
  function wireApproval(div) {
    div.querySelectorAll('button').forEach(function (button) {
      button.addEventListener('click', function () { decide(div, button.dataset.decision); });
    });
  }
  function awaitCall(e) {
    if (approvalPanels().some(function (d) { return d.dataset.callId === str(e.callId); })) return;
    var div = approvalItem(e); wireApproval(div); approvalList.appendChild(div);
    approvals.hidden = false;
  }
  function settleCall(callId) {
    approvalPanels().forEach(function (d) { if (d.dataset.callId === str(callId)) d.remove(); });
    if (!approvalList.children.length) approvals.hidden = true;
  }
  approvalPanels().forEach(wireApproval);
  var ticker = null;
  function finish() {
    ended = true;
    document.getElementById('stop-soft').disabled = true;
    document.getElementById('stop-hard').disabled = true;
    document.getElementById('retry').disabled = false;
    if (ticker) { clearInterval(ticker); ticker = null; }
  }
  function atBottom() {
    return window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 80;
  }
  if (root.dataset.finished !== 'true') {
    ticker = setInterval(tick, 1000);
    var url = base + '/stream?afterSeq=' + last + (tq ? '&' + tq : '');
    var es = new EventSource(url);
    es.onopen = function () { conn.textContent = ''; };
    es.onerror = function () { if (es.readyState !== 2) conn.textContent = '(reconnecting\u2026)'; };
    es.addEventListener('run_event', function (m) {
      var e = JSON.parse(m.data);
      if (e.seq != null && e.seq <= last) return;
      if (e.seq != null) last = e.seq;
      count += 1;
      document.getElementById('f-events').textContent = String(count);
      if (tail) {
        var follow = atBottom();
        list.appendChild(render(e));
        while (list.children.length > MAX_ITEMS) { list.removeChild(list.firstChild); first += 1; }
        range.textContent = first + '\u2013' + count + ' of ' + count;
        if (follow) window.scrollTo(0, document.documentElement.scrollHeight);
      }
      if (e.type === 'answer') { document.getElementById('answer').textContent = str(e.text); if (tail) markFinalAnswer(); }
      if (e.type === 'run_failed') showError(str(e.message));
      if (e.type === 'assistant' && e.usage) addUsage(e);
      if (e.type === 'stop_requested') setStatus('stopping (' + str(e.mode) + ')', 'stopping');
      if (e.type === 'approval_requested') awaitCall(e);
      if ((e.type === 'approval_decided' || e.type === 'tool_result') && e.callId != null) settleCall(e.callId);
      refresh();
    });
    es.addEventListener('end', function (m) {
      es.close();
      var d = JSON.parse(m.data);
      if (d.provisional) setStatus('unfinished \u2014 no finish recorded', 'warn');
      else setStatus(str(d.status), statusClass(d.status));
      if (d.finishedAt != null) {
        var t = new Date(d.finishedAt).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
        document.getElementById('f-finished').textContent = t;
      }
      finish();
      approvalPanels().forEach(function (d) { d.remove(); });
      approvals.hidden = true;
      document.getElementById('now-slot').textContent = '';
      if (d.finishedAt != null) { ranEl.textContent = dur(d.finishedAt - startedAt); durEl.textContent = ranEl.textContent; }
      conn.textContent = '';
      refresh();
    });
  }
  // One request of a control; its answer is written to `out` (the controls' line unless given), and
  // `then` hears the response and its body (a null response when the request failed).
  function call(method, path, body, then, out) {
    out = out || msg;
    out.textContent = '\u2026';
    var url = path + (tq ? (path.indexOf('?') < 0 ? '?' : '&') + tq : '');
    var init = { method: method, headers: {} };
    if (body) { init.headers['content-type'] = 'application/json'; init.body = JSON.stringify(body); }
    fetch(url, init).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (b) {
        out.textContent = r.status + ' ' + str(b.state || b.outcome || b.message || b.error || '');
        if (then) then(r, b);
      });
    }, function (err) { out.textContent = 'request failed: ' + err; if (then) then(null, {}); });
  }
  // Run again: the answer names the new run (or the live run it steered into); link it.
  function linkRun(r, b) {
    if (!r || !r.ok || typeof b.runId !== 'string') return;
    var a = document.createElement('a');
    a.id = 'retry-link';
    var to = '/runs/' + encodeURIComponent(b.runId);
    if (typeof b.liveUrl === 'string') {
      try { var u = new URL(b.liveUrl, location.href); to = u.pathname + u.search; } catch (err) {}
    }
    a.href = to;
    a.textContent = 'open run ' + b.runId;
    msg.appendChild(document.createTextNode(' \u2014 '));
    msg.appendChild(a);
  }
  document.getElementById('stop-soft').addEventListener('click', function () { call('POST', base + '/stop', { mode: 'soft' }); });
  document.getElementById('stop-hard').addEventListener('click', function () { call('POST', base + '/stop', { mode: 'hard' }); });
  document.getElementById('kill').addEventListener('click', function () {
    if (window.confirm && !window.__noConfirm && !window.confirm('Kill this run? Its history is deleted.')) return;
    call('DELETE', base);
  });
  document.getElementById('retry').addEventListener('click', function () { call('POST', base + '/retry', null, linkRun); });
})();
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buttons_post_json_and_send_no_body_otherwise() {
        // The edge refuses a body that is not `application/json` (SPEC §8.1): the script's one button
        // `fetch` sets that type whenever it sends a body, and Kill sends none.
        assert!(RUN_JS.contains("if (body) { init.headers['content-type'] = 'application/json'; init.body = JSON.stringify(body); }"));
        assert!(RUN_JS.contains("call('DELETE', base);"));
        // Run again posts no body (the retry's body is optional).
        assert!(RUN_JS.contains("call('POST', base + '/retry', null, linkRun);"));
        // A decision posts JSON through the same call, so with the page's capability token as Stop does.
        assert!(RUN_JS.contains(
            "call('POST', base + '/approvals/' + encodeURIComponent(div.dataset.callId), body,"
        ));
        assert!(RUN_JS
            .contains("var url = path + (tq ? (path.indexOf('?') < 0 ? '?' : '&') + tq : '');"));
        // Two fetches: the buttons' one, and the timeline fragment's GET (no body).
        assert_eq!(RUN_JS.matches("fetch(").count(), 2);
        assert!(RUN_JS.contains("fetch('/runs/' + encodeURIComponent(id) + '/timeline'"));
    }

    #[test]
    fn run_strings_are_set_as_text_and_only_the_servers_fragment_as_markup() {
        for js in ALL {
            assert!(
                !js.contains("innerHTML")
                    && !js.contains("insertAdjacentHTML")
                    && !js.contains("document.write")
            );
        }
        assert_eq!(RUN_JS.matches("parseFromString(").count(), 1);
    }
}
