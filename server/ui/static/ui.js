// logstore browser: relative and local times, transcript/raw toggle, expand/collapse all, follow mode (polling). Served by logstore, no build.
"use strict";
(function () {
  var units = [[31536000, "y"], [86400, "d"], [3600, "h"], [60, "min"]];

  function relative(iso) {
    var s = Math.floor((Date.now() - Date.parse(iso)) / 1000);
    if (isNaN(s)) return "";
    if (s < 0) return "in the future";
    for (var i = 0; i < units.length; i++) {
      if (s >= units[i][0]) return Math.floor(s / units[i][0]) + " " + units[i][1] + " ago";
    }
    return s + " s ago";
  }

  function pad(n) { return (n < 10 ? "0" : "") + n; }

  // The instant in the browser's time zone, beside the UTC one: "local 2025-12-03 21:00:00 UTC+9".
  function local(iso) {
    var d = new Date(iso);
    if (isNaN(d.getTime())) return "";
    var off = -d.getTimezoneOffset();
    var zone = "UTC" + (off < 0 ? "-" : "+") + Math.floor(Math.abs(off) / 60) +
      (Math.abs(off) % 60 ? ":" + pad(Math.abs(off) % 60) : "");
    return "local " + d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()) + " " + zone;
  }

  function refreshTimes(root) {
    var els = (root || document).querySelectorAll("[data-rel]");
    for (var i = 0; i < els.length; i++) els[i].textContent = relative(els[i].getAttribute("data-rel"));
    var locals = (root || document).querySelectorAll("[data-local]:empty");
    for (var j = 0; j < locals.length; j++) locals[j].textContent = local(locals[j].getAttribute("data-local"));
  }

  function setAll(open) {
    var els = document.querySelectorAll("#items details.j");
    for (var i = 0; i < els.length; i++) els[i].open = open;
  }

  function follow(box) {
    var url = box.getAttribute("data-follow");
    var next = parseInt(box.getAttribute("data-next"), 10);
    var status = document.getElementById("follow-status");
    var delay = 500;

    function poll() {
      fetch(url + "?from=" + next, { credentials: "same-origin", cache: "no-store" })
        .then(function (r) {
          if (!r.ok) throw new Error("HTTP " + r.status);
          return r.json();
        })
        .then(function (body) {
          delay = 500;
          if (body.next > next) {
            var atBottom = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
            var holder = document.createElement("div");
            holder.innerHTML = body.html; // server-rendered and escaped, as the page itself
            refreshTimes(holder);
            while (holder.firstChild) box.appendChild(holder.firstChild);
            next = body.next;
            box.setAttribute("data-next", String(next));
            var last = document.getElementById("last-seq");
            if (last) last.textContent = String(next - 1);
            if (atBottom) window.scrollTo(0, document.body.scrollHeight);
          }
          if (status) status.textContent = "following: up to date at seq " + (next - 1);
        })
        .catch(function (err) {
          delay = Math.min(delay * 2, 10000);
          if (status) status.textContent = "following: " + err.message + ", retrying";
        })
        .then(function () { window.setTimeout(poll, delay); });
    }
    poll();
  }

  // The transcript view, or the raw JSON one, as the reader last chose: kept in localStorage and in a
  // cookie the server reads to render that view alone.
  var VIEW_KEY = "logstore.view";

  function storedView() {
    try { return window.localStorage.getItem(VIEW_KEY) || "transcript"; } catch (e) { return "transcript"; }
  }

  function chooseView(view) {
    try { window.localStorage.setItem(VIEW_KEY, view); } catch (e) { /* the cookie still holds it */ }
    document.cookie = "logstore_view=" + view + "; path=/ui; max-age=31536000; SameSite=Strict";
    // Reload only when the cookie took (cookies off: a reload would render the same view, for ever).
    if (document.cookie.indexOf("logstore_view=" + view) >= 0) window.location.reload();
  }

  document.addEventListener("DOMContentLoaded", function () {
    var toggle = document.getElementById("view-toggle");
    if (toggle) {
      var shown = toggle.getAttribute("data-view");
      if (storedView() !== shown && document.cookie.indexOf("logstore_view=") < 0) {
        chooseView(storedView()); // remembered here, but the cookie went: render the chosen view
        return;
      }
      toggle.addEventListener("click", function () { chooseView(shown === "raw" ? "transcript" : "raw"); });
    }
    document.documentElement.className += " js-on";
    refreshTimes();
    window.setInterval(refreshTimes, 30000);
    var expand = document.getElementById("expand-all");
    var collapse = document.getElementById("collapse-all");
    if (expand) expand.addEventListener("click", function () { setAll(true); });
    if (collapse) collapse.addEventListener("click", function () { setAll(false); });
    var box = document.getElementById("items");
    if (box && box.getAttribute("data-target")) {
      var target = document.getElementById(box.getAttribute("data-target"));
      if (target) { target.classList.add("target"); target.scrollIntoView({ block: "center" }); }
    }
    if (box && box.getAttribute("data-follow")) follow(box);
  });
})();
