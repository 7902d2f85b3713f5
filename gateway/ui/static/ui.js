// Isthmus dashboard: keeps a job page live by re-reading its server-rendered fragment, and
// shows the chosen worker's output. The fragment is HTML the gateway escaped; it replaces
// the section as a whole. Output is set with textContent only: whatever a job printed
// stays text. The job's events (server-sent) trigger a refresh; a 2-second timer is the
// fallback.
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
  var outBusy = false, outAgain = false;
  function loadOutput() {
    if (!out) return Promise.resolve();
    if (outBusy) { outAgain = true; return Promise.resolve(); }  // read again once this read is done
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
      .then(function () {
        outBusy = false;
        if (outAgain) { outAgain = false; return loadOutput(); }
      });
  }
  if (worker) worker.addEventListener("change", loadOutput);

  var latest = 0;  // an event and the timer can overlap: only the newest answer is shown
  function refresh() {
    var mine = ++latest;
    return fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null || mine !== latest) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        live.replaceChildren.apply(live, Array.prototype.slice.call(doc.body.childNodes));
        var s = document.getElementById("state");
        live.setAttribute("data-final", FINAL.test(s ? s.textContent : "") ? "true" : "false");
        return loadOutput();
      });
  }
  window.isthmusRefreshJob = refresh;
  loadOutput();

  // The job's events (server-sent, /ui/events) re-render the page as they happen; the
  // timer stays as the fallback (no EventSource, a proxy that buffers, a lost stream).
  var jobId = live.getAttribute("data-job-id");
  var stream = null;
  if (window.EventSource && live.getAttribute("data-final") !== "true") {
    stream = new EventSource(live.getAttribute("data-events-url"));
    stream.addEventListener("job", function (m) {
      var ev = null;
      try { ev = JSON.parse(m.data); } catch (e) { return; }
      if (ev && ev.job_id === jobId) refresh();
    });
  }
  var timer = setInterval(function () {
    if (live.getAttribute("data-final") === "true") {
      clearInterval(timer);
      if (stream) stream.close();
      return;
    }
    refresh();
  }, 2000);
})();
