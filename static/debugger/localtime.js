// Timestamps in the operator's time zone: every <time data-when> the server wrote (in its
// own zone, as a fallback) is rewritten in the browser's, in the same format, with the
// full time and the zone's name in its title. Swapped-in fragments too.
(function () {
  "use strict";

  var MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

  function two(n) { return (n < 10 ? "0" : "") + n; }
  function three(n) { return (n < 10 ? "00" : n < 100 ? "0" : "") + n; }

  function zoneName(date) {
    try {
      var parts = new Intl.DateTimeFormat(undefined, { timeZoneName: "short" }).formatToParts(date);
      var zone = parts.filter(function (p) { return p.type === "timeZoneName"; })[0];
      return zone ? zone.value : "";
    } catch (e) {
      return "";
    }
  }

  function localise(el) {
    var date = new Date(el.getAttribute("datetime"));
    if (isNaN(date.getTime())) return;
    var clock = two(date.getHours()) + ":" + two(date.getMinutes()) + ":" + two(date.getSeconds());
    var ms = three(date.getMilliseconds());
    el.textContent = el.getAttribute("data-when") === "ms"
      ? clock + "." + ms
      : MONTHS[date.getMonth()] + " " + date.getDate() + ", " + clock;
    el.title = date.getFullYear() + "-" + two(date.getMonth() + 1) + "-" + two(date.getDate()) +
      " " + clock + "." + ms + " " + zoneName(date);
    el.setAttribute("data-local", "");
  }

  function localiseAll(root) {
    (root || document).querySelectorAll("time[data-when]:not([data-local])").forEach(localise);
  }

  document.addEventListener("DOMContentLoaded", function () { localiseAll(document); });
  document.addEventListener("htmx:afterSettle", function () { localiseAll(document); });
  document.addEventListener("htmx:oobAfterSwap", function () { localiseAll(document); });
})();
