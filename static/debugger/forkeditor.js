// The fork page's state editor: a tree over the raw JSON textarea.
//
// The textarea stays the form field and the server stays the judge: every tree edit
// rewrites the textarea's text (pretty JSON, as the server wrote it) and fires its
// "input" event, which htmx turns into a debounced check of the state and a preview of
// the diff. Without this script the textarea is the editor, as before.
//
// The state is parsed here by a small JSON reader of our own rather than JSON.parse,
// so that what is not edited comes back byte for byte: numbers keep their text (1.0,
// 12345678901234567890), keys keep their order (JS objects put "2" before "1"), and a
// string holding JSON text keeps its exact text until something inside it is edited.
(function () {
  "use strict";

  var MAX_DEPTH = 400; // deeper than any state the server accepts
  var TREE_MAX_CHARS = 6 * 1024 * 1024; // larger texts stay in the raw editor
  var SHOWN = 200; // children listed per container before "show more"
  var PREVIEW = 140; // characters of a string shown in its row
  var NUMBER = /^-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?$/;

  // --- reading JSON into nodes ----------------------------------------------------------
  // {t: "object", e: [[key, node], ...]} | {t: "array", e: [node, ...]}
  // | {t: "string", v, j?: {node, style, text, dirty}} | {t: "number", raw}
  // | {t: "boolean", v} | {t: "null"}

  function ParseError(message, pos) {
    this.message = message;
    this.pos = pos;
  }

  function read(text, style) {
    var i = 0;
    function ws() {
      var start = i;
      while (i < text.length && " \t\n\r".indexOf(text[i]) >= 0) i++;
      return text.slice(start, i);
    }
    function fail(what) {
      throw new ParseError(what + " at position " + i, i);
    }
    function string() {
      var start = i;
      i++;
      while (i < text.length && text[i] !== '"') i += text[i] === "\\" ? 2 : 1;
      if (i >= text.length) fail("Unterminated string");
      i++;
      try {
        return JSON.parse(text.slice(start, i));
      } catch (err) {
        i = start;
        fail("Bad string");
      }
    }
    function value(depth) {
      if (depth > MAX_DEPTH) fail("Nested too deeply");
      ws();
      var c = text[i];
      if (c === "{" || c === "[") {
        var obj = c === "{", node = { t: obj ? "object" : "array", e: [] };
        i++;
        var inner = ws();
        if (style && style.inner === null) style.inner = inner;
        if (text[i] === (obj ? "}" : "]")) { i++; return node; }
        for (;;) {
          if (obj) {
            if (text[i] !== '"') fail("Expected a key");
            var key = string();
            var before = ws();
            if (text[i] !== ":") fail("Expected ':'");
            i++;
            var after = ws();
            if (style && style.colon === null) style.colon = before + ":" + after;
            node.e.push([key, value(depth + 1)]);
          } else {
            node.e.push(value(depth + 1));
          }
          ws();
          if (text[i] === ",") {
            i++;
            var sep = ws();
            if (style && style.comma === null) style.comma = "," + sep;
            continue;
          }
          if (text[i] === (obj ? "}" : "]")) { i++; return node; }
          fail("Expected ',' or '" + (obj ? "}" : "]") + "'");
        }
      }
      if (c === '"') return stringNode(string());
      var m = /^-?\d[\d.eE+-]*/.exec(text.slice(i, i + 400)) || /^-/.exec(text.slice(i, i + 1));
      if (m) {
        if (!NUMBER.test(m[0])) fail("Bad number");
        i += m[0].length;
        return { t: "number", raw: m[0] };
      }
      var words = { "true": true, "false": false, "null": null };
      for (var w in words) {
        if (text.startsWith(w, i)) {
          i += w.length;
          return words[w] === null ? { t: "null" } : { t: "boolean", v: words[w] };
        }
      }
      fail(i >= text.length ? "Unexpected end of JSON" : "Unexpected character");
    }
    var node = value(0);
    ws();
    if (i < text.length) fail("Unexpected text after the JSON");
    return node;
  }

  // A string that is a JSON object or list is kept as its parsed tree too.
  function stringNode(v) {
    var node = { t: "string", v: v };
    var s = v.trim();
    if (s.length >= 2 && ((s[0] === "{" && s[s.length - 1] === "}") || (s[0] === "[" && s[s.length - 1] === "]"))) {
      var style = { comma: null, colon: null, inner: null };
      try {
        node.j = { node: read(v, style), style: textStyle(v, style), text: v, dirty: false };
      } catch (err) {
        if (!(err instanceof ParseError)) throw err;
      }
    }
    return node;
  }

  // How JSON text was written, so that an edit writes it back the same way.
  function textStyle(text, seen) {
    var lead = /^\s*/.exec(text)[0], trail = /\s*$/.exec(text)[0];
    var inner = seen.inner || "";
    if (inner.indexOf("\n") >= 0 || (seen.comma || "").indexOf("\n") >= 0) {
      var nl = (inner.indexOf("\n") >= 0 ? inner : seen.comma).split("\n");
      return { indent: nl[nl.length - 1] || "  ", colon: (seen.colon || ": ").replace(/\n.*/, ""), lead: lead, trail: trail, ascii: asciiOnly(text) };
    }
    // Python's json.dumps writes ", " and ": " by default: the style of an empty list too.
    return { indent: null, comma: seen.comma === null ? ", " : seen.comma, colon: seen.colon === null ? ": " : seen.colon, lead: lead, trail: trail, ascii: asciiOnly(text) };
  }

  function asciiOnly(text) {
    // ensure_ascii=True text escapes every non-ASCII character and contains none.
    return /\\u[0-9a-fA-F]{4}/.test(text) && !/[^\x00-\x7f]/.test(text);
  }

  // --- writing nodes back -----------------------------------------------------------------

  function quote(v, ascii) {
    var s = JSON.stringify(v);
    if (!ascii) return s;
    return s.replace(/[^\x00-\x7f]/g, function (c) {
      return "\\u" + ("000" + c.charCodeAt(0).toString(16)).slice(-4);
    });
  }

  function write(node, style, level) {
    switch (node.t) {
      case "null": return "null";
      case "boolean": return node.v ? "true" : "false";
      case "number": return node.raw;
      case "string":
        if (node.j && node.j.dirty) {
          var js = node.j.style;
          return quote(js.lead + write(node.j.node, js, 0) + js.trail, style.ascii);
        }
        return quote(node.j ? node.j.text : node.v, style.ascii);
    }
    var obj = node.t === "object", open = obj ? "{" : "[", close = obj ? "}" : "]";
    if (!node.e.length) return open + close;
    var parts = node.e.map(function (item) {
      return obj ? quote(item[0], style.ascii) + style.colon + write(item[1], style, level + 1) : write(item, style, level + 1);
    });
    if (style.indent === null) return open + parts.join(style.comma) + close;
    var pad = "\n" + style.indent.repeat(level + 1);
    return open + pad + parts.join("," + pad) + "\n" + style.indent.repeat(level) + close;
  }

  var PAGE_STYLE = { indent: "  ", colon: ": ", ascii: false }; // json.dumps(indent=2, ensure_ascii=False)

  // --- paths, as the debugger writes them: memory.notes["a b"][3] ------------------------

  function childPath(path, key) {
    if (typeof key === "number") return path + "[" + key + "]";
    if (/^[A-Za-z_][A-Za-z0-9_]*$/.test(key)) return path ? path + "." + key : key;
    return path + "[" + JSON.stringify(key) + "]";
  }

  // --- the tree ---------------------------------------------------------------------------

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function button(cls, text, title, action) {
    var b = el("button", "te-btn " + cls, text);
    b.type = "button";
    b.title = title;
    b.setAttribute("aria-label", title);
    b.setAttribute("data-te", action);
    return b;
  }

  // A collapsed container's first few members, as compact JSON cut at PEEK characters.
  var PEEK = 70;
  function peek(node) {
    var out = "";
    function add(text) { out += text; return out.length < PEEK; }
    function walk(n) {
      if (n.t === "object" || n.t === "array") {
        if (!add(n.t === "object" ? "{" : "[")) return false;
        for (var i = 0; i < n.e.length; i++) {
          if (i && !add(", ")) return false;
          if (n.t === "object" && !add(JSON.stringify(n.e[i][0]) + ": ")) return false;
          if (!walk(n.t === "object" ? n.e[i][1] : n.e[i])) return false;
        }
        return add(n.t === "object" ? "}" : "]");
      }
      if (n.t === "string") return add(JSON.stringify(n.v.length > PEEK ? n.v.slice(0, PEEK) : n.v));
      return add(write(n, PAGE_STYLE, 0));
    }
    return walk(node) ? out : out.slice(0, PEEK) + "…";
  }

  function count(node) {
    var n = node.e.length;
    return node.t === "object" ? n + " key" + (n === 1 ? "" : "s") : n + " item" + (n === 1 ? "" : "s");
  }

  function Editor(area, host) {
    this.area = area;
    this.host = host;
    this.root = null;
    this.text = null; // the textarea text the tree was read from
    this.open = { "": true }; // expanded paths
    this.shown = {}; // path → children listed
    this.nodes = {}; // path → {node, parent, key}
    var self = this;
    host.addEventListener("click", function (event) { self.click(event); });
    host.addEventListener("keydown", function (event) { self.key(event); });
  }

  // Read the textarea; false (with the reason) when it is not JSON the tree can show.
  Editor.prototype.load = function () {
    var text = this.area.value;
    if (text === this.text && this.root) return true;
    if (text.length > TREE_MAX_CHARS) {
      return "The state is too large for the tree: edit it as raw JSON.";
    }
    try {
      this.root = read(text, null);
    } catch (err) {
      if (!(err instanceof ParseError)) throw err;
      return "Invalid JSON (" + err.message + "): fix it in the raw editor first.";
    }
    this.text = text;
    this.render();
    return true;
  };

  Editor.prototype.render = function () {
    this.nodes = {};
    var list = el("ul", "te-tree");
    list.setAttribute("role", "tree");
    list.appendChild(this.row(this.root, null, "", null, 0));
    this.host.replaceChildren(list);
  };

  // The tree's text goes to the textarea; "input" tells htmx to check it.
  Editor.prototype.changed = function () {
    this.text = write(this.root, PAGE_STYLE, 0);
    this.area.value = this.text;
    this.area.classList.remove("invalid");
    this.area.removeAttribute("aria-invalid");
    this.area.dispatchEvent(new Event("input", { bubbles: true }));
    this.render();
  };

  Editor.prototype.row = function (node, key, path, parent, depth) {
    var li = el("li", "te-node te-" + node.t);
    li.setAttribute("role", "treeitem");
    li.setAttribute("data-path", path || "$");
    this.nodes[path || "$"] = { node: node, parent: parent, key: key };
    var line = el("div", "te-row");
    li.appendChild(line);
    var inner = node.t === "string" && node.j ? node.j.node : null;
    var box = node.t === "object" || node.t === "array" ? node : inner;
    if (box) {
      var isOpen = !!this.open[path];
      li.setAttribute("aria-expanded", isOpen ? "true" : "false");
      var toggle = button("te-toggle", isOpen ? "▾" : "▸", (isOpen ? "Collapse " : "Expand ") + (path || "the state"), "toggle");
      line.appendChild(toggle);
    } else {
      line.appendChild(el("span", "te-toggle-gap"));
    }
    if (key === null) {
      line.appendChild(el("span", "te-key te-root", "state"));
      line.appendChild(el("span", "te-colon", ":"));
    } else {
      line.appendChild(el("span", typeof key === "number" ? "te-key te-index" : "te-key", typeof key === "number" ? "[" + key + "]" : key));
      line.appendChild(el("span", "te-colon", ":"));
    }
    if (box) {
      var brackets = box.t === "object" ? ["{", "}"] : ["[", "]"];
      line.appendChild(el("span", "te-meta", brackets[0] + " " + count(box) + " " + brackets[1]));
      if (inner) {
        var tag = el("span", "tag te-jsontext", "JSON text");
        tag.title = "A string holding JSON: edited as a tree, written back as text" + (node.j.dirty ? " (edited)" : "");
        line.appendChild(tag);
        if (node.j.dirty) line.appendChild(el("span", "tag edited", "edited"));
      }
      if (!this.open[path]) line.appendChild(el("span", "te-peek", peek(box)));
      if (inner) line.appendChild(button("te-astext", "text", "Edit " + path + " as text", "edit"));
      line.appendChild(button("te-add", box.t === "object" ? "+ key" : "+ item", box.t === "object" ? "Add a key to " + (path || "the state") : "Add an item to " + (path || "the state"), "add"));
    } else {
      line.appendChild(this.scalar(node));
    }
    if (parent) line.appendChild(button("te-remove", "×", "Remove " + path, "remove"));
    if (box && this.open[path]) li.appendChild(this.children(box, path, node, depth));
    return li;
  };

  Editor.prototype.scalar = function (node) {
    var text;
    if (node.t === "string") {
      text = JSON.stringify(node.v.length > PREVIEW ? node.v.slice(0, PREVIEW) + "…" : node.v);
    } else {
      text = write(node, PAGE_STYLE, 0);
    }
    var v = el("button", "te-val jt-" + node.t, text);
    v.type = "button";
    v.title = "Edit this " + node.t + (node.t === "string" && node.v.length > PREVIEW ? " (" + node.v.length + " characters)" : "");
    v.setAttribute("data-te", "edit");
    return v;
  };

  Editor.prototype.children = function (box, path, owner, depth) {
    var ul = el("ul", "te-children");
    ul.setAttribute("role", "group");
    var limit = this.shown[path] || SHOWN;
    var self = this;
    box.e.slice(0, limit).forEach(function (item, i) {
      var key = box.t === "object" ? item[0] : i;
      var child = box.t === "object" ? item[1] : item;
      ul.appendChild(self.row(child, key, childPath(path, key), { box: box, owner: owner }, depth + 1));
    });
    if (box.e.length > limit) {
      var more = el("li", "te-more");
      var b = button("te-showmore", "show " + Math.min(SHOWN, box.e.length - limit) + " more of " + box.e.length, "Show more of " + path, "more");
      b.setAttribute("data-path", path);
      more.appendChild(b);
      ul.appendChild(more);
    }
    return ul;
  };

  // Open the tree down to `path` (as the server writes it) and mark that entry.
  Editor.prototype.reveal = function (path) {
    this.host.querySelectorAll(".te-flagged").forEach(function (e) { e.classList.remove("te-flagged"); });
    if (path === null || !this.root) return;
    var chain = chainOf(path), at = chain[chain.length - 1];
    var self = this, closed = chain.slice(0, -1).filter(function (p) { return !self.open[p]; });
    // Not while a value is being edited: that would throw the edit away.
    if (closed.length && !this.host.querySelector(".te-form")) {
      closed.forEach(function (p) { self.open[p] = true; });
      this.render();
    }
    var li = this.host.querySelector('li[data-path="' + cssEscape(at || "$") + '"]');
    if (li) {
      li.classList.add("te-flagged");
      var row = li.querySelector(":scope > .te-row");
      if (row.scrollIntoView) row.scrollIntoView({ block: "nearest" });
    }
  };

  // Open the tree where the page suggests (what changed last before the snapshot): each
  // path's ancestors, and the path itself when it holds a few entries.
  var OPEN_MAX_ENTRIES = 20;

  function chainOf(path) {
    var tokens = /([^.[\]]+)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')\]/g;
    var m, at = "", chain = [""];
    while ((m = tokens.exec(path)) !== null) {
      var key = m[1] !== undefined ? m[1] : m[2] !== undefined ? Number(m[2]) : m[3].slice(1, -1).replace(/\\(.)/g, "$1");
      at = childPath(at, key);
      chain.push(at);
    }
    return chain;
  }

  Editor.prototype.openAt = function (paths) {
    if (!this.root || !paths.length) return;
    var self = this;
    paths.forEach(function (path) {
      chainOf(path).slice(0, -1).forEach(function (p) { self.open[p] = true; });
    });
    this.render();
    paths.forEach(function (path) {
      var info = self.nodes[path];
      var node = info && info.node;
      var box = node && (node.t === "object" || node.t === "array" ? node : node.t === "string" && node.j ? node.j.node : null);
      if (box && box.e.length <= OPEN_MAX_ENTRIES) self.open[path] = true;
    });
    this.render();
  };

  Editor.prototype.entryOf = function (target) {
    var li = target.closest("li.te-node");
    return li ? { li: li, path: li.getAttribute("data-path"), info: this.nodes[li.getAttribute("data-path")] } : null;
  };

  // A change below a string holding JSON marks that string edited (written back as text).
  Editor.prototype.touch = function (path) {
    for (var p in this.nodes) {
      var n = this.nodes[p].node;
      if (n.j && (path === p || path.startsWith(p + ".") || path.startsWith(p + "["))) n.j.dirty = true;
    }
  };

  Editor.prototype.click = function (event) {
    var b = event.target.closest("[data-te]");
    if (!b || !this.host.contains(b)) return;
    var action = b.getAttribute("data-te");
    if (action === "more") {
      var mp = b.getAttribute("data-path");
      this.shown[mp] = (this.shown[mp] || SHOWN) + SHOWN;
      this.render();
      return;
    }
    var at = this.entryOf(b);
    if (!at) return;
    var path = at.path === "$" ? "" : at.path;
    if (action === "toggle") {
      this.open[path] = !this.open[path];
      this.render();
      this.focus(at.path, "toggle");
    } else if (action === "remove") {
      var parent = at.info.parent, key = at.info.key;
      if (parent.box.t === "object") {
        parent.box.e = parent.box.e.filter(function (item) { return item[0] !== key; });
      } else {
        parent.box.e.splice(key, 1);
      }
      this.touch(path);
      this.changed();
    } else if (action === "edit") {
      this.editValue(at, path);
    } else if (action === "add") {
      this.open[path] = true;
      this.render();
      this.addForm(this.host.querySelector('li[data-path="' + cssEscape(at.path) + '"]'), path);
    }
  };

  Editor.prototype.key = function (event) {
    if (event.key !== "Escape") return;
    var form = event.target.closest(".te-form");
    if (!form) return;
    event.preventDefault();
    var path = form.getAttribute("data-for");
    this.render();
    this.focus(path, form.classList.contains("te-addform") ? "add" : "edit");
  };

  Editor.prototype.focus = function (path, action) {
    var li = this.host.querySelector('li[data-path="' + cssEscape(path) + '"]');
    var b = li && li.querySelector(":scope > .te-row [data-te=" + action + "]");
    if (b) b.focus();
  };

  // The inputs for one value: its type, then a text box (or true/false).
  function valueInputs(form, node) {
    var type = el("select", "te-type");
    type.setAttribute("aria-label", "Type");
    ["string", "number", "boolean", "null", "object", "array"].forEach(function (t) {
      var o = el("option", "", t);
      o.value = t;
      type.appendChild(o);
    });
    type.value = node ? node.t : "string";
    var long = node && node.t === "string" && (node.v.length > 60 || node.v.indexOf("\n") >= 0);
    var input = el(long ? "textarea" : "input", "te-input");
    if (!long) input.type = "text";
    input.setAttribute("aria-label", "Value");
    input.spellcheck = false;
    if (node) input.value = node.t === "string" ? node.v : node.t === "number" ? node.raw : node.t === "boolean" ? String(node.v) : "";
    if (long) input.rows = Math.min(12, Math.max(3, input.value.split("\n").length + 1));
    function sync() {
      var t = type.value;
      input.hidden = t === "null" || t === "object" || t === "array";
      input.placeholder = t === "boolean" ? "true or false" : t === "number" ? "e.g. 1 or 2.5" : "";
    }
    type.addEventListener("change", sync);
    sync();
    form.appendChild(type);
    form.appendChild(input);
    return { type: type, input: input };
  }

  // The node a type and text make, or a message saying what is wrong.
  function makeValue(type, text) {
    switch (type) {
      case "string": return stringNode(text);
      case "null": return { t: "null" };
      case "object": return { t: "object", e: [] };
      case "array": return { t: "array", e: [] };
      case "number":
        text = text.trim();
        return NUMBER.test(text) ? { t: "number", raw: text } : "Not a JSON number: write it like 3, -1 or 2.5e3.";
      case "boolean":
        text = text.trim().toLowerCase();
        return text === "true" || text === "false" ? { t: "boolean", v: text === "true" } : "Write true or false.";
    }
  }

  function formButtons(form, ok) {
    var save = el("button", "btn small primary", ok);
    save.type = "button";
    save.setAttribute("data-te-save", "");
    var cancel = el("button", "btn small ghost", "Cancel");
    cancel.type = "button";
    cancel.setAttribute("data-te-cancel", "");
    form.appendChild(save);
    form.appendChild(cancel);
    var problem = el("span", "te-problem");
    problem.setAttribute("role", "alert");
    form.appendChild(problem);
    form.addEventListener("input", function () { problem.textContent = ""; });
    return problem;
  }

  // Inline forms are <div>s: a <form> can't sit inside the page's form.
  function inlineForm(cls, path, onSubmit, self) {
    var form = el("div", "te-form " + cls);
    form.setAttribute("data-for", path || "$");
    form.addEventListener("keydown", function (event) {
      if (event.key !== "Enter" || event.target.tagName === "BUTTON") return;
      if (event.target.tagName !== "TEXTAREA" || event.ctrlKey || event.metaKey) {
        event.preventDefault();
        onSubmit();
      }
    });
    form.addEventListener("click", function (event) {
      if (event.target.matches("[data-te-save]")) {
        event.preventDefault();
        onSubmit();
      } else if (event.target.matches("[data-te-cancel]")) {
        self.render();
        self.focus(path || "$", cls === "te-addform" ? "add" : "edit");
      }
    });
    return form;
  }

  Editor.prototype.editValue = function (at, path) {
    var self = this, node = at.info.node, inputs, problem;
    var form = inlineForm("te-editform", path, function () {
      var made = makeValue(inputs.type.value, inputs.input.value);
      if (typeof made === "string") { problem.textContent = made; return; }
      var parent = at.info.parent;
      if (!parent) self.root = made;
      else if (parent.box.t === "object") parent.box.e.forEach(function (item) { if (item[0] === at.info.key) item[1] = made; });
      else parent.box.e[at.info.key] = made;
      self.touch(path);
      self.changed();
      self.focus(path || "$", made.t === "object" || made.t === "array" || made.j ? "add" : "edit");
    }, self);
    inputs = valueInputs(form, node);
    problem = formButtons(form, "Keep");
    // A string holding JSON is edited as text from its row's "text" button.
    var value = at.li.querySelector(":scope > .te-row > .te-val, :scope > .te-row > .te-meta");
    value.replaceWith(form);
    at.li.querySelectorAll(":scope > .te-row > .te-astext, :scope > .te-row > .te-add, :scope > .te-children").forEach(function (e) { e.remove(); });
    inputs.input.focus();
    if (inputs.input.select) inputs.input.select();
  };

  Editor.prototype.addForm = function (li, path) {
    var self = this, info = this.nodes[path || "$"], node = info.node;
    var box = node.j ? node.j.node : node;
    var keyInput = null, inputs, problem;
    var form = inlineForm("te-addform", path, function () {
      var made = makeValue(inputs.type.value, inputs.input.value);
      if (box.t === "object") {
        var key = keyInput.value;
        if (!key) { problem.textContent = "Name the key."; return; }
        if (box.e.some(function (item) { return item[0] === key; })) { problem.textContent = "There is a key " + JSON.stringify(key) + " already."; return; }
        if (typeof made === "string") { problem.textContent = made; return; }
        box.e.push([key, made]);
      } else {
        if (typeof made === "string") { problem.textContent = made; return; }
        box.e.push(made);
      }
      self.shown[path] = Math.max(self.shown[path] || SHOWN, box.e.length);
      self.touch(childPath(path, box.t === "object" ? keyInput.value : box.e.length - 1));
      self.changed();
      self.focus(path || "$", "add");
    }, self);
    if (box.t === "object") {
      keyInput = el("input", "te-keyinput");
      keyInput.type = "text";
      keyInput.placeholder = "key";
      keyInput.setAttribute("aria-label", "Key");
      form.appendChild(keyInput);
    } else {
      form.appendChild(el("span", "te-key te-index", "[" + box.e.length + "]"));
    }
    inputs = valueInputs(form, null);
    problem = formButtons(form, box.t === "object" ? "Add key" : "Add item");
    var holder = el("li", "te-adding");
    holder.appendChild(form);
    var children = li.querySelector(":scope > .te-children");
    if (!children) {
      children = el("ul", "te-children");
      li.appendChild(children);
    }
    children.appendChild(holder);
    (keyInput || inputs.input).focus();
  };

  function cssEscape(s) {
    return window.CSS && CSS.escape ? CSS.escape(s) : s.replace(/["\\]/g, "\\$&");
  }

  // --- the page: tree or raw, the live check --------------------------------------------

  function setup() {
    var area = document.getElementById("fork-state");
    var host = document.querySelector("[data-state-tree]");
    var views = document.querySelector("[data-editor-views]");
    if (!area || !host || !views) return;
    var editor = new Editor(area, host);
    var status = document.getElementById("fork-state-status");
    var treeHint = document.querySelector("[data-tree-hint]");
    var rawHint = document.querySelector("[data-raw-hint]");

    function show(view) {
      if (view === "tree") {
        var ok = editor.load();
        if (ok !== true) {
          // After the textarea's own check on leaving it, which says less.
          if (status) setTimeout(function () {
            status.textContent = ok;
            status.className = "json-status bad";
          }, 0);
          return false;
        }
      }
      host.hidden = view !== "tree";
      area.hidden = view === "tree";
      treeHint.hidden = view !== "tree";
      rawHint.hidden = view === "tree";
      views.querySelectorAll("[data-editor-view]").forEach(function (b) {
        b.setAttribute("aria-pressed", b.getAttribute("data-editor-view") === view ? "true" : "false");
      });
      document.getElementById("fork-editor").setAttribute("data-view", view);
      var box = document.getElementById("fork-check");
      if (view === "tree" && box) editor.reveal(box.getAttribute("data-error-path"));
      try { sessionStorage.setItem("agentrun.forkeditor.view", view); } catch (err) { /* private mode */ }
      return true;
    }

    views.hidden = false;
    views.addEventListener("click", function (event) {
      var b = event.target.closest("[data-editor-view]");
      if (!b) return;
      var view = b.getAttribute("data-editor-view");
      if (show(view) && view === "raw") area.focus();
    });
    var wanted = "tree";
    try { wanted = sessionStorage.getItem("agentrun.forkeditor.view") || "tree"; } catch (err) { /* private mode */ }
    if (area.classList.contains("invalid") || !show(wanted)) show("raw");
    else if (wanted === "tree") {
      editor.openAt([].map.call(document.querySelectorAll("#fork-editor [data-open-path]"), function (e) {
        return e.getAttribute("data-open-path");
      }));
    }

    // The live check: a state larger than a form may post is not sent (the server would refuse
    // the request before reading it); the page says so instead.
    document.body.addEventListener("htmx:configRequest", function (event) {
      if (event.detail.elt !== area) return;
      var limit = Number(area.getAttribute("data-max-bytes")) || 0;
      var size = new Blob([area.value]).size;
      if (limit && size > limit - 4096) {
        event.preventDefault();
        var box = document.getElementById("fork-check");
        box.replaceChildren(el("div", "callout bad check-errors",
          "The state is " + (size / 1048576).toFixed(1) + " MB: more than the page can send (" +
          (limit / 1048576).toFixed(1) + " MB). Fork it through the API, or make it smaller."));
      }
    });
    // The check's answer is the page's only swap.
    document.body.addEventListener("htmx:afterSettle", function () {
      var box = document.getElementById("fork-check");
      if (!box) return;
      if (!host.hidden) editor.reveal(box.getAttribute("data-error-path"));
      // A passing check clears what the last submit said about the state.
      if (box.getAttribute("data-valid") === "true") {
        var old = document.getElementById("fork-state-error");
        if (old) old.remove();
      }
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setup);
  else setup();

  // For tests and the curious: the reader and writer on their own.
  // dirty: write every string holding JSON from its tree, as an edit inside it would.
  window.agentrunForkEditor = {
    rewrite: function (text, dirty) {
      var root = read(text, null);
      (function mark(n) {
        if (n.j) { n.j.dirty = dirty; mark(n.j.node); }
        if (n.e) n.e.forEach(function (item) { mark(Array.isArray(item) ? item[1] : item); });
      })(root);
      return write(root, PAGE_STYLE, 0);
    },
  };
})();
