// agentrun debugger: keyboard time travel, copy buttons, keeping the selected step marked.
// No inline scripts anywhere (the CSP forbids them); htmx does the requests.
(function () {
  "use strict";

  function selectedStep() {
    var body = document.getElementById("step-body");
    return body ? body.getAttribute("data-step") : null;
  }

  // The strip and the list are re-rendered by polling; the selection lives in #step-body.
  function markSelected(scroll) {
    var n = selectedStep();
    document.querySelectorAll("#strip [data-n], #step-list [data-n]").forEach(function (el) {
      el.classList.toggle("sel", el.getAttribute("data-n") === n);
    });
    if (scroll && n) {
      // Scroll the list only, never the page.
      var list = document.getElementById("step-list");
      var row = list && list.querySelector('[data-n="' + CSS.escape(n) + '"]');
      if (row) {
        var top = row.offsetTop - list.offsetTop, bottom = top + row.offsetHeight;
        if (top < list.scrollTop || bottom > list.scrollTop + list.clientHeight) {
          list.scrollTop = top - list.clientHeight / 2;
        }
      }
    }
  }

  function typing(target) {
    var tag = target && target.tagName;
    return tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT" || (target && target.isContentEditable);
  }

  // ← / k: previous step, → / j: next step. Works on every page with rel=prev/next links.
  document.addEventListener("keydown", function (event) {
    if (event.altKey || event.ctrlKey || event.metaKey || event.shiftKey || typing(event.target)) return;
    var rel = null;
    if (event.key === "ArrowLeft" || event.key === "k") rel = "prev";
    if (event.key === "ArrowRight" || event.key === "j") rel = "next";
    if (!rel) return;
    var scope = document.getElementById("step-body") || document;
    var link = scope.querySelector('a[rel="' + rel + '"]') || document.querySelector('a[rel="' + rel + '"]');
    if (link) {
      event.preventDefault();
      link.click();
    }
  });

  // Copy a JSON path or an idempotency key.
  document.addEventListener("click", function (event) {
    var button = event.target.closest(".jt-copy, .copy");
    if (!button) return;
    event.preventDefault(); // a copy button inside <summary> must not toggle it
    event.stopPropagation();
    var text = button.getAttribute("data-path") || button.getAttribute("data-copy") || "";
    var done = function () {
      var label = button.textContent;
      button.classList.add("copied");
      button.textContent = "copied";
      setTimeout(function () { button.classList.remove("copied"); button.textContent = label; }, 1200);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () { fallbackCopy(text); done(); });
    } else {
      fallbackCopy(text);
      done();
    }
  });

  function fallbackCopy(text) {
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "offscreen";
    document.body.appendChild(area);
    area.select();
    try { document.execCommand("copy"); } catch (e) { /* nothing else to try */ }
    document.body.removeChild(area);
  }

  // Polling replaces the step list: keep its scroll position and the selection.
  var listScroll = null;
  document.addEventListener("htmx:beforeSwap", function () {
    var list = document.getElementById("step-list");
    listScroll = list ? list.scrollTop : null;
  });
  document.addEventListener("htmx:oobAfterSwap", function (event) {
    var list = document.getElementById("step-list");
    if (list && listScroll !== null) list.scrollTop = listScroll;
    markSelected(false);
  });
  document.addEventListener("htmx:afterSettle", function (event) {
    var target = event.detail && event.detail.target;
    markSelected(target && target.id === "step-body");
  });
  document.addEventListener("DOMContentLoaded", function () { markSelected(true); });
})();
