// volume-agent operator page: keeps ages and countdowns running, swaps in
// each new rendering the agent streams (server-sent events), and submits
// the filters when one changes. The page works without it.
(function () {
  "use strict";

  var live = document.getElementById("live");
  var status = document.getElementById("live-status");
  // The agent's clock minus ours: ages are counted on the agent's clock.
  var offset = 0;

  function setStatus(cls, text, title) {
    if (!status) return;
    status.className = "live " + cls;
    status.textContent = text;
    status.title = title || "";
  }

  function syncClock() {
    var view = document.getElementById("view");
    var now = view && Date.parse(view.getAttribute("data-now"));
    if (now) offset = now - Date.now();
  }

  // human is kubectl's HumanDuration.
  function human(ms) {
    var s = Math.floor(ms / 1000);
    if (s < -1) return "<invalid>";
    if (s < 0) return "0s";
    if (s < 120) return s + "s";
    var m = Math.floor(s / 60);
    if (m < 10) return s % 60 ? m + "m" + (s % 60) + "s" : m + "m";
    if (m < 180) return m + "m";
    var h = Math.floor(m / 60);
    if (h < 8) return m % 60 ? h + "h" + (m % 60) + "m" : h + "h";
    if (h < 48) return h + "h";
    var d = Math.floor(h / 24);
    if (h < 24 * 8) return h % 24 ? d + "d" + (h % 24) + "h" : d + "d";
    if (h < 24 * 365 * 2) return d + "d";
    var y = Math.floor(d / 365);
    if (h < 24 * 365 * 8) return d % 365 ? y + "y" + (d % 365) + "d" : y + "y";
    return y + "y";
  }

  function tick() {
    var now = Date.now() + offset;
    var ages = document.querySelectorAll("time[data-age]");
    for (var i = 0; i < ages.length; i++) {
      var t = Date.parse(ages[i].getAttribute("datetime"));
      if (t) ages[i].textContent = human(now - t);
    }
    var untils = document.querySelectorAll("time[data-until]");
    for (var j = 0; j < untils.length; j++) {
      var u = Date.parse(untils[j].getAttribute("datetime"));
      if (u) untils[j].textContent = u > now ? "in " + human(u - now) : "now";
    }
  }

  var selects = document.querySelectorAll("form.filters select");
  for (var k = 0; k < selects.length; k++) {
    selects[k].addEventListener("change", function (e) { e.target.form.submit(); });
  }

  syncClock();
  tick();
  setInterval(tick, 1000);

  if (!live || !window.EventSource || !live.getAttribute("data-stream")) return;
  var source = new EventSource(live.getAttribute("data-stream"));
  setStatus("retry", "connecting…");
  source.addEventListener("open", function () {
    setStatus("on", "live", "the page updates as the agent's state changes");
  });
  // The agent's clock is read once, from the page it rendered for this
  // load: a streamed view may have been rendered earlier for another viewer.
  source.addEventListener("view", function (e) {
    live.innerHTML = e.data;
    tick();
    document.dispatchEvent(new CustomEvent("volume-agent:updated"));
  });
  source.addEventListener("error", function () {
    if (source.readyState === EventSource.CLOSED) {
      setStatus("off", "not live", "the agent refused the live stream (too many viewers?); reload to refresh");
    } else {
      setStatus("retry", "reconnecting…", "the connection to the agent was lost; retrying");
    }
  });
})();
