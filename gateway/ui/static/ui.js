// Isthmus dashboard: keeps a job page live by re-reading its server-rendered fragment, and
// shows the chosen worker's output. The fragment is HTML the gateway escaped; it replaces
// the section as a whole. Output is set with textContent only: whatever a job printed
// stays text. `window.isthmusRefreshJob` can be called on each event of an event stream
// instead of on the timer.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) return;
  var url = live.getAttribute("data-live-url");
  var FINAL = /^(succeeded|failed|cancelled)$/;

  var out = document.getElementById("output");
  var outText = document.getElementById("output-text");
  var outStatus = document.getElementById("output-status");
  var outRaw = document.getElementById("output-raw");
  var worker = document.getElementById("worker");
  var outBusy = false;
  function loadOutput() {
    if (!out || outBusy) return Promise.resolve();
    var st = document.getElementById("state");
    var state = st ? st.textContent : "";
    if (state === "pending" || state === "blocked") {  // not on a pool yet: nothing to ask for
      outText.hidden = true;
      outStatus.textContent = "no output yet: the job is " + state;
      return Promise.resolve();
    }
    outBusy = true;
    var base = out.getAttribute("data-output-url");
    var tail = out.getAttribute("data-tail");
    var w = worker ? worker.value : "0";
    if (outRaw) outRaw.setAttribute("href", base + "?worker=" + encodeURIComponent(w));
    return fetch(base + "?worker=" + encodeURIComponent(w) + "&tail=" + tail,
                 { credentials: "same-origin", headers: { "Accept": "text/plain" } })
      .then(function (r) { return r.text().then(function (t) { return { ok: r.ok, text: t }; }); })
      .then(function (res) {
        if (res.ok) {
          var atEnd = outText.scrollTop + outText.clientHeight >= outText.scrollHeight - 4;
          outText.textContent = res.text;
          outText.hidden = false;
          outStatus.textContent = "worker " + w + ", last " + tail + " lines";
          if (atEnd) outText.scrollTop = outText.scrollHeight;
        } else {
          outText.textContent = "";
          outText.hidden = true;
          outStatus.textContent = res.text;
        }
      })
      .catch(function () { outStatus.textContent = "could not read the output; retrying"; })
      .then(function () { outBusy = false; });
  }
  if (worker) worker.addEventListener("change", loadOutput);

  function refresh() {
    return fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        live.replaceChildren.apply(live, Array.prototype.slice.call(doc.body.childNodes));
        var s = document.getElementById("state");
        live.setAttribute("data-final", FINAL.test(s ? s.textContent : "") ? "true" : "false");
        return loadOutput();
      });
  }
  window.isthmusRefreshJob = refresh;
  loadOutput();
  var timer = setInterval(function () {
    if (live.getAttribute("data-final") === "true") { clearInterval(timer); return; }
    refresh();
  }, 2000);
})();
