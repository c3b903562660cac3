// graphflow-durable console: confirmations and live updates. No inline script anywhere (CSP).
"use strict";

document.addEventListener("submit", function (event) {
  var form = event.target;
  var question = form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});

function element(tag, className, text) {
  var node = document.createElement(tag);
  if (className) { node.className = className; }
  if (text !== undefined) { node.textContent = text; }  // always text, never HTML
  return node;
}

function appendMessage(list, m) {
  if (list.querySelector('[data-seq="' + m.seq + '"]')) { return; }
  var item = element("li", "message");
  item.setAttribute("data-seq", String(m.seq));
  item.setAttribute("data-source", m.source);
  var meta = element("div", "meta");
  meta.appendChild(element("span", "seq", "#" + m.seq));
  meta.appendChild(document.createTextNode(" "));
  meta.appendChild(element("span", "source", m.source));
  meta.appendChild(document.createTextNode(" "));
  meta.appendChild(element("span", "type", m.type));
  meta.appendChild(document.createTextNode(" "));
  meta.appendChild(element("time", null, m.time));
  item.appendChild(meta);
  item.appendChild(element("pre", "text", m.text));
  list.appendChild(item);
}

function applyState(run, state) {
  run.setAttribute("data-status", state.status);
  var status = run.querySelector('[data-field="status"]');
  if (status) {
    status.textContent = state.status;
    status.className = "status status-" + state.status;
  }
  var messages = run.querySelector('[data-field="messages"]');
  if (messages) { messages.textContent = String(state.messages); }
  if (state.states) {
    Object.keys(state.states).forEach(function (node) {
      document.querySelectorAll("[data-node]").forEach(function (el) {
        if (el.getAttribute("data-node") === node) { el.setAttribute("data-state", state.states[node]); }
      });
    });
  }
}

function follow() {
  var run = document.getElementById("run");
  var list = document.getElementById("transcript");
  if (!run || !list || !window.EventSource) { return; }
  var url = run.getAttribute("data-events") + "?after=" + encodeURIComponent(run.getAttribute("data-last-seq"));
  var source = new EventSource(url);
  source.addEventListener("message", function (event) {
    var m = JSON.parse(event.data);
    appendMessage(list, m);
    run.setAttribute("data-last-seq", String(m.seq));
  });
  source.addEventListener("state", function (event) { applyState(run, JSON.parse(event.data)); });
  source.addEventListener("gone", function () {
    source.close();
    run.setAttribute("data-status", "deleted");
    var status = run.querySelector('[data-field="status"]');
    if (status) { status.textContent = "deleted"; }
  });
  source.addEventListener("refused", function (event) {
    source.close();
    var note = document.createElement("p");
    note.className = "refusal";
    note.textContent = JSON.parse(event.data).error;
    list.parentNode.insertBefore(note, list);
  });
  window.addEventListener("pagehide", function () { source.close(); });
}

document.addEventListener("DOMContentLoaded", follow);
