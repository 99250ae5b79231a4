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

  // The run page's live refresh: say whether the step shown is the page's own pick (or
  // none), and whether the search form is missing, so the server can open the step and
  // bring the form as a fresh load would. A step the operator picked is left alone.
  document.addEventListener("htmx:configRequest", function (event) {
    var elt = event.detail.elt;
    if (!elt || elt.id !== "run-live") return;
    var body = document.getElementById("step-body");
    if (body && (body.classList.contains("empty") || body.hasAttribute("data-auto"))) {
      event.detail.parameters.open = "1";
      event.detail.parameters.shown = body.getAttribute("data-step") || "";
    }
    if (!document.querySelector("form#run-search")) event.detail.parameters.form = "0";
  });

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
    markCompared();
  });
  document.addEventListener("DOMContentLoaded", function () {
    markSelected(true);
    document.querySelectorAll("textarea[data-json-editor].invalid").forEach(function (area) {
      var problem = checkJSON(area);
      if (problem && problem.pos !== null) {
        area.focus();
        area.setSelectionRange(problem.pos, problem.pos);
        // Bring the line with the mistake into view, a third of the way down.
        var line = area.value.slice(0, problem.pos).split("\n").length;
        var height = parseFloat(getComputedStyle(area).lineHeight) || 18;
        area.scrollTop = Math.max(0, (line - 1) * height - area.clientHeight / 3);
      }
    });
  });

  // Compare view: the row whose diff is shown stays marked.
  function markCompared() {
    var pane = document.getElementById("compare-diff");
    if (!pane) return;
    var n = pane.getAttribute("data-step");
    document.querySelectorAll("#compare-rows [data-n]").forEach(function (row) {
      row.classList.toggle("sel", row.getAttribute("data-n") === n);
    });
  }

  // The fork form's state editor: Tab indents (Esc, then Tab, moves on), JSON checked on blur.
  var INDENT = "  ";
  var escaped = false;

  function insert(area, text, start, end) {
    area.focus();
    area.setSelectionRange(start, end);
    // execCommand keeps the browser's undo history; setRangeText is the fallback.
    if (!document.execCommand || !document.execCommand("insertText", false, text)) {
      area.setRangeText(text, start, end, "end");
    }
  }

  function indent(area, outdent) {
    var value = area.value, start = area.selectionStart, end = area.selectionEnd;
    if (start === end && !outdent) {
      insert(area, INDENT, start, end);
      return;
    }
    var from = value.lastIndexOf("\n", start - 1) + 1;
    var lines = value.slice(from, end).split("\n");
    var changed = lines.map(function (line) {
      if (!outdent) return INDENT + line;
      return line.slice(line.startsWith(INDENT) ? INDENT.length : line.startsWith(" ") ? 1 : 0);
    }).join("\n");
    insert(area, changed, from, end);
    area.setSelectionRange(from, from + changed.length);
  }

  document.addEventListener("keydown", function (event) {
    var area = event.target;
    if (!area.matches || !area.matches("textarea[data-json-editor]")) return;
    if (event.key === "Escape") { escaped = true; return; }
    if (event.key !== "Tab" || event.altKey || event.ctrlKey || event.metaKey) { escaped = false; return; }
    if (escaped) { escaped = false; return; } // let Tab leave the editor
    event.preventDefault();
    indent(area, event.shiftKey);
  });

  // {pos, message} for invalid JSON, null when it parses.
  function checkJSON(area) {
    try {
      JSON.parse(area.value);
      return null;
    } catch (err) {
      var match = /position (\d+)/.exec(err.message);
      var pos = match ? Number(match[1]) : null;
      var where = "";
      if (pos !== null) {
        var before = area.value.slice(0, pos).split("\n");
        where = " at line " + before.length + ", column " + (before[before.length - 1].length + 1);
      }
      var reason = err.message.replace(/\s*(in JSON )?at position \d+.*$/, "").replace(/^JSON\.parse: /, "");
      return { pos: pos, message: "Invalid JSON" + where + ": " + reason };
    }
  }

  // An untouched state need not travel back (the server has it, and a 2.5 MB state would
  // exceed the upload limit): leave it out and say so.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var area = form.querySelector("textarea[data-json-editor][data-pristine]");
    if (!area || area.value !== area.defaultValue) return;
    area.disabled = true;
    var flag = form.querySelector("input[name=state_unchanged]") || document.createElement("input");
    flag.type = "hidden";
    flag.name = "state_unchanged";
    flag.value = "1";
    form.appendChild(flag);
  });
  // Back to a page from the cache: the editor must be usable again.
  window.addEventListener("pageshow", function () {
    document.querySelectorAll("textarea[data-json-editor]:disabled").forEach(function (area) {
      area.disabled = false;
    });
  });

  document.addEventListener("focusout", function (event) {
    var area = event.target;
    if (!area.matches || !area.matches("textarea[data-json-editor]")) return;
    var status = document.getElementById(area.id + "-status");
    var problem = checkJSON(area);
    area.classList.toggle("invalid", problem !== null);
    if (problem) area.setAttribute("aria-invalid", "true"); else area.removeAttribute("aria-invalid");
    if (status) {
      status.textContent = problem ? problem.message : "valid JSON";
      status.className = "json-status " + (problem ? "bad" : "ok");
    }
  });
})();

// --- a diff's list of groups opens the group it links to (a collapsed <details>).
(function () {
  "use strict";
  document.addEventListener("click", function (event) {
    var link = event.target.closest && event.target.closest("a[data-open]");
    if (!link) return;
    var group = document.getElementById(link.getAttribute("data-open"));
    if (group && group.tagName === "DETAILS") group.open = true;
  });
})();

// a long run's strip groups steps into cells (data-lo..data-hi) and its step
// list holds a window of rows. When the selected step is outside the window (a cell or
// the keyboard went there), load the window around it; keep the cell that holds it marked.
(function () {
  "use strict";

  function selected() {
    var body = document.getElementById("step-body");
    var n = body && body.getAttribute("data-step");
    return n ? Number(n) : null;
  }

  function markBins() {
    var n = selected();
    document.querySelectorAll("#strip .cell[data-lo]").forEach(function (cell) {
      var on = n !== null && Number(cell.getAttribute("data-lo")) <= n && n <= Number(cell.getAttribute("data-hi"));
      cell.classList.toggle("sel", on);
    });
  }

  function scrollToRow(list, n) {
    var row = list.querySelector('[data-n="' + n + '"]');
    if (row) list.scrollTop += row.getBoundingClientRect().top - list.getBoundingClientRect().top - 90;
  }

  function followSelection() {
    var n = selected(), list = document.getElementById("step-list");
    if (n === null || !list || !window.htmx) return;
    if (list.querySelector('[data-n="' + n + '"]')) return;
    var url = list.getAttribute("data-window");
    if (!url) return;
    window.htmx.ajax("GET", url + n, { target: "#step-list", swap: "outerHTML" });
  }

  document.addEventListener("htmx:afterSettle", function (event) {
    var target = event.detail && event.detail.target;
    markBins();
    if (target && target.id === "step-body") followSelection();
    if (target && target.id === "step-list") {
      var n = selected();
      if (n !== null) {
        var list = document.getElementById("step-list");
        list.querySelectorAll("[data-n]").forEach(function (el) {
          el.classList.toggle("sel", el.getAttribute("data-n") === String(n));
        });
        scrollToRow(list, n);
      }
    }
  });
  document.addEventListener("htmx:oobAfterSwap", markBins);
  document.addEventListener("DOMContentLoaded", function () {
    markBins();
    var n = selected(), list = document.getElementById("step-list");
    // A long list opens with the selected row near its top, wherever the list sits on the page.
    if (n !== null && list && list.querySelector(".more")) scrollToRow(list, n);
  });
})();
