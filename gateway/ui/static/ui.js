// Isthmus dashboard: keeps a job page live by re-reading its server-rendered fragment.
// The fragment is HTML the gateway escaped; it replaces the section as a whole. When the
// event stream (#18, 5) lands, `refresh` can be called on each event instead of on a timer.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) return;
  var url = live.getAttribute("data-live-url");
  function refresh() {
    return fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        live.replaceChildren.apply(live, Array.prototype.slice.call(doc.body.childNodes));
        var s = document.getElementById("state");
        live.setAttribute("data-final", /^(succeeded|failed|cancelled|timeout)$/.test(s ? s.textContent : "") ? "true" : "false");
      });
  }
  window.isthmusRefreshJob = refresh;
  var timer = setInterval(function () {
    if (live.getAttribute("data-final") === "true") { clearInterval(timer); return; }
    refresh();
  }, 2000);
})();
