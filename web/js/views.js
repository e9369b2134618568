// The page's JavaScript half, bundled by `cargo xtask web` (esbuild) with
// the npm packages it imports into one file, `views.js`, that index.html
// loads before the wasm module. It does what libraries do best and Rust's
// UI calls it: the code editor (CodeMirror 6), the graph's layered layout
// (dagre, in a worker: see layout.js), pan and zoom of the drawing, and
// marking boxes by class. It
// holds no compiler facts: the Rust side hands it boxes and sizes.
import { EditorState, StateEffect, StateField, Prec, Annotation } from "@codemirror/state";
import {
  EditorView, Decoration, keymap, lineNumbers, highlightActiveLine,
  highlightActiveLineGutter, drawSelection,
} from "@codemirror/view";
import { defaultKeymap, history, historyKeymap, indentWithTab } from "@codemirror/commands";
import { syntaxHighlighting, bracketMatching, indentOnInput, StreamLanguage } from "@codemirror/language";
import { classHighlighter } from "@lezer/highlight";
import { setDiagnostics, lintGutter } from "@codemirror/lint";
import { searchKeymap, highlightSelectionMatches } from "@codemirror/search";

// ----- editor ---------------------------------------------------------

// Marks changes made by the page (an example loaded), which must not
// count as typing.
const fromPage = Annotation.define();
const setErrorLine = StateEffect.define();

// The line of the last run's error, as a line decoration.
const errorLine = StateField.define({
  create: () => Decoration.none,
  update(lines, tr) {
    lines = lines.map(tr.changes);
    for (const effect of tr.effects) {
      if (effect.is(setErrorLine)) {
        lines = effect.value === null
          ? Decoration.none
          : Decoration.set([Decoration.line({ class: "cm-error-line" }).range(effect.value)]);
      }
    }
    return lines;
  },
  provide: (field) => EditorView.decorations.from(field),
});

class Editor {
  constructor(view) {
    this.view = view;
  }

  text() {
    return this.view.state.doc.toString();
  }

  setText(text) {
    if (text === this.text()) return;
    this.view.dispatch({
      changes: { from: 0, to: this.view.state.doc.length, insert: text },
      annotations: fromPage.of(true),
    });
  }

  // Marks the error at 1-based `line` and `column` (the word there, else
  // one character) with its message, and the whole line.
  markError(line, column, message) {
    const doc = this.view.state.doc;
    const at = doc.line(Math.min(Math.max(line, 1), doc.lines));
    const from = Math.min(at.from + Math.max(column, 1) - 1, at.to);
    const word = this.view.state.wordAt(from);
    const to = word && word.from === from ? word.to : Math.min(from + 1, at.to);
    const diagnostics = [{ from, to, severity: "error", message }];
    this.view.dispatch(setDiagnostics(this.view.state, diagnostics));
    this.view.dispatch({ effects: setErrorLine.of(at.from) });
  }

  clearError() {
    this.view.dispatch(setDiagnostics(this.view.state, []));
    this.view.dispatch({ effects: setErrorLine.of(null) });
  }

  // Puts the cursor at the start of 1-based `line` and scrolls it into view.
  revealLine(line) {
    const doc = this.view.state.doc;
    const at = doc.line(Math.min(Math.max(line, 1), doc.lines));
    this.view.dispatch({
      selection: { anchor: at.from, head: at.to },
      effects: EditorView.scrollIntoView(at.from, { y: "center" }),
    });
  }
}

// ----- Rhai -------------------------------------------------------------

// C-style comments, which both grammars share. `continueComment` goes on
// with a block comment begun on an earlier line (`state.inComment`);
// `startComment` reads a line comment or the start of a block comment.
// Each returns "comment" where it read one, else null.
function continueComment(stream, state) {
  if (!state.inComment) return null;
  if (stream.skipTo("*/")) { stream.next(); stream.next(); state.inComment = false; } else stream.skipToEnd();
  return "comment";
}

function startComment(stream, state) {
  if (stream.match("//")) { stream.skipToEnd(); return "comment"; }
  if (stream.match("/*")) { state.inComment = true; return "comment"; }
  return null;
}

// Rhai for highlighting and indentation, token by token: keywords,
// literals, strings (with `${}` inside backtick strings), comments,
// definitions after `let`/`const`/`fn`, namespaces (`nn::`) and
// properties. A grammar of its own rather than JavaScript's: Rhai's
// keywords differ, and a full JavaScript parser is most of the editor's
// bundle.
const RHAI_KEYWORDS = new Set(("let const fn if else switch do while until loop for in break continue " +
  "return throw try catch import export as private global this is").split(" "));
const RHAI_ATOMS = new Set(["true", "false"]);
const rhai = StreamLanguage.define({
  name: "rhai",
  token(stream, state) {
    if (continueComment(stream, state)) return "comment";
    if (state.inTemplate) {
      if (stream.match("${")) { state.inTemplate = false; state.templateDepth = 1; return "meta"; }
      while (!stream.eol()) {
        if (stream.peek() === "`") { stream.next(); state.inTemplate = false; return "string"; }
        if (stream.match("${", false)) return "string";
        if (stream.next() === "\\") stream.next();
      }
      return "string";
    }
    if (stream.eatSpace()) return null;
    if (state.templateDepth > 0) {
      if (stream.peek() === "{") state.templateDepth += 1;
      if (stream.peek() === "}") {
        state.templateDepth -= 1;
        if (state.templateDepth === 0) { stream.next(); state.inTemplate = true; return "meta"; }
      }
    }
    if (startComment(stream, state)) return "comment";
    if (stream.match(/^(?:0x[0-9a-fA-F_]+|0b[01_]+|0o[0-7_]+|\d[\d_]*(?:\.\d[\d_]*)?(?:e[+-]?\d+)?)/)) return "number";
    const quote = stream.peek();
    if (quote === '"' || quote === "'") {
      stream.next();
      for (let c; (c = stream.next()) !== undefined;) {
        if (c === "\\") stream.next();
        else if (c === quote) break;
      }
      return "string";
    }
    if (quote === "`") { stream.next(); state.inTemplate = true; return "string"; }
    const word = stream.match(/^[A-Za-z_]\w*/);
    if (word) {
      const name = word[0];
      const defining = state.defining;
      state.defining = name === "let" || name === "const" || name === "fn";
      if (RHAI_KEYWORDS.has(name)) return "keyword";
      if (RHAI_ATOMS.has(name)) return "bool";
      if (stream.match("::", false)) return "namespace";
      if (defining) return "variableName.definition";
      return state.afterDot ? (state.afterDot = false, "propertyName") : "variableName";
    }
    const c = stream.next();
    state.afterDot = c === ".";
    if ("{[(".includes(c)) state.indent += 1;
    if ("}])".includes(c)) state.indent = Math.max(0, state.indent - 1);
    return /[{}\[\]()]/.test(c) ? "bracket" : "operator";
  },
  startState: () => ({ inComment: false, inTemplate: false, templateDepth: 0, defining: false, afterDot: false, indent: 0 }),
  indent: (state, textAfter, context) => Math.max(0, state.indent - (/^[}\])]/.test(textAfter) ? 1 : 0)) * context.unit,
  languageData: { commentTokens: { line: "//", block: { open: "/*", close: "*/" } }, indentOnInput: /^\s*[}\])]$/ },
});

// A CodeMirror editor in `parent` holding `doc`. `onChange(text)` follows
// typing; `onRun()` is Ctrl+Enter (Cmd+Enter).
export function createEditor(parent, doc, onChange, onRun) {
  const run = () => {
    onRun();
    return true;
  };
  const view = new EditorView({
    parent,
    state: EditorState.create({
      doc,
      extensions: [
        Prec.highest(keymap.of([{ key: "Mod-Enter", run }])),
        lineNumbers(),
        highlightActiveLineGutter(),
        history(),
        drawSelection(),
        indentOnInput(),
        bracketMatching(),
        rhai,
        // Token classes (`tok-keyword`, …) rather than a fixed palette:
        // style.css colours them for the light and the dark scheme.
        syntaxHighlighting(classHighlighter),
        highlightActiveLine(),
        highlightSelectionMatches(),
        keymap.of([...defaultKeymap, ...historyKeymap, ...searchKeymap, indentWithTab]),
        lintGutter(),
        errorLine,
        EditorView.updateListener.of((update) => {
          if (update.docChanged && !update.transactions.some((t) => t.annotation(fromPage))) {
            onChange(update.state.doc.toString());
          }
        }),
      ],
    }),
  });
  const editor = new Editor(view);
  // The browser tests read and write the program through this handle.
  globalThis.kilnEditor = editor;
  return editor;
}

// ----- kernel source ----------------------------------------------------

// WGSL for highlighting only: keywords, types and builtins, numbers,
// attributes and comments, as token classes the page's theme colours.
const WGSL_KEYWORDS = new Set(("alias break case const const_assert continue continuing default " +
  "diagnostic discard else enable fn for if let loop override requires return struct switch var while " +
  "true false").split(" "));
const WGSL_TYPES = /^(?:array|atomic|bool|f16|f32|i32|u32|mat[234]x[234][fh]?|ptr|sampler|texture_\w+|vec[234][fuih]?|storage|uniform|workgroup|private|function|read|write|read_write)$/;
const wgsl = StreamLanguage.define({
  name: "wgsl",
  token(stream, state) {
    if (continueComment(stream, state)) return "comment";
    if (stream.eatSpace()) return null;
    if (startComment(stream, state)) return "comment";
    if (stream.match(/^@\w+/)) return "meta";
    if (stream.match(/^(?:0x[0-9a-fA-F]+|\d+\.?\d*(?:e[+-]?\d+)?|\.\d+)[iufh]?/)) return "number";
    const word = stream.match(/^[A-Za-z_]\w*/);
    if (word) {
      if (WGSL_KEYWORDS.has(word[0])) return "keyword";
      if (WGSL_TYPES.test(word[0])) return "typeName";
      return "variableName";
    }
    stream.next();
    return "operator";
  },
  startState: () => ({ inComment: false }),
});

// A read-only CodeMirror view of a kernel's WGSL in `parent`.
class CodeView {
  constructor(parent) {
    // The browser tests read the shown source through the host element.
    parent.kilnCodeView = this;
    this.view = new EditorView({
      parent,
      state: EditorState.create({
        doc: "",
        extensions: [
          lineNumbers(),
          EditorState.readOnly.of(true),
          EditorView.editable.of(false),
          wgsl,
          syntaxHighlighting(classHighlighter),
        ],
      }),
    });
  }

  text() {
    return this.view.state.doc.toString();
  }

  // Shows `text` scrolled to its entry point (`@compute`): the shared
  // helpers above it are a scroll away.
  setText(text) {
    if (text === this.text()) return;
    this.view.dispatch({ changes: { from: 0, to: this.view.state.doc.length, insert: text } });
    const entry = Math.max(text.indexOf("@compute"), 0);
    this.view.dispatch({ effects: EditorView.scrollIntoView(entry, { y: "start", yMargin: 4 }) });
  }
}

export function createCodeView(parent) {
  return new CodeView(parent);
}

// ----- graph ----------------------------------------------------------

// The layout worker, started on first use, and the layouts it owes.
let layoutWorker = null;
let nextLayout = 0;
const pendingLayouts = new Map();

function startLayoutWorker() {
  layoutWorker = new Worker("./layout.js");
  layoutWorker.onmessage = ({ data }) => {
    const pending = pendingLayouts.get(data.id);
    pendingLayouts.delete(data.id);
    if (!pending) return;
    if (data.error !== undefined) pending.reject(new Error(data.error));
    else pending.resolve(data.layout);
  };
  // A worker that fails to load fails every layout it owes; the next
  // request starts a fresh one.
  layoutWorker.onerror = (event) => {
    event.preventDefault();
    for (const pending of pendingLayouts.values()) {
      pending.reject(new Error(event.message || "the layout worker failed"));
    }
    pendingLayouts.clear();
    layoutWorker.terminate();
    layoutWorker = null;
  };
}

// Lays a graph out in the layout worker: a promise of `layoutGraph`'s
// result (see layout.js) for the same input.
export function layoutGraph(input) {
  if (!layoutWorker) startLayoutWorker();
  const id = nextLayout;
  nextLayout += 1;
  return new Promise((resolve, reject) => {
    pendingLayouts.set(id, { resolve, reject });
    layoutWorker.postMessage({ id, input });
  });
}

// The smallest zoom a drawing starts at: 11 px text at 0.7 is about 8 px.
const READABLE_ZOOM = 0.7;

// Pan (drag the background) and zoom (wheel, about the pointer) of the
// `<g class="viewport">` inside `svg`. Idempotent per element.
export function panZoom(svg) {
  if (svg.kilnPanZoom) return;
  const viewport = svg.querySelector("g.viewport");
  const state = { x: 0, y: 0, k: 1 };
  const apply = () => viewport.setAttribute("transform", `translate(${state.x},${state.y}) scale(${state.k})`);
  svg.addEventListener("wheel", (e) => {
    e.preventDefault();
    const r = svg.getBoundingClientRect();
    const px = e.clientX - r.left;
    const py = e.clientY - r.top;
    const k = Math.min(4, Math.max(0.05, state.k * Math.exp(-e.deltaY * 0.0015)));
    state.x = px - ((px - state.x) * k) / state.k;
    state.y = py - ((py - state.y) * k) / state.k;
    state.k = k;
    apply();
  }, { passive: false });
  let drag = null;
  svg.addEventListener("pointerdown", (e) => {
    if (e.target.closest("[data-box]")) return;
    drag = { x: e.clientX - state.x, y: e.clientY - state.y, from: [e.clientX, e.clientY], id: e.pointerId, captured: false };
  });
  svg.addEventListener("pointermove", (e) => {
    if (!drag) return;
    // Captured only once the pointer has moved: a capture turns the
    // click's target into the svg, and a click on a fused group's frame
    // must reach the group.
    if (!drag.captured && Math.hypot(e.clientX - drag.from[0], e.clientY - drag.from[1]) > 3) {
      svg.setPointerCapture(drag.id);
      drag.captured = true;
    }
    state.x = e.clientX - drag.x;
    state.y = e.clientY - drag.y;
    apply();
  });
  svg.addEventListener("pointerup", () => {
    drag = null;
  });
  svg.kilnPanZoom = {
    // Centres the drawing's point (x, y) in the view.
    focus(x, y) {
      const r = svg.getBoundingClientRect();
      state.x = r.width / 2 - x * state.k;
      state.y = r.height / 2 - y * state.k;
      apply();
    },
    // Scales the whole drawing (width, height) into the view, at most 1:1
    // and at least `floor`: a drawing larger than that shows its top,
    // centred, and pans.
    fit(width, height, floor) {
      const r = svg.getBoundingClientRect();
      const whole = Math.min(1, r.width / Math.max(width, 1), r.height / Math.max(height, 1));
      state.k = Math.max(whole, floor);
      state.x = (r.width - width * state.k) / 2;
      state.y = 0;
      apply();
    },
    zoom() {
      return state.k;
    },
  };
  apply();
}

// Centres (x, y) of the drawing in `svg`'s view.
export function focusGraph(svg, x, y) {
  panZoom(svg);
  svg.kilnPanZoom.focus(x, y);
}

// Fits the whole drawing in `svg`'s view.
export function fitGraph(svg, width, height) {
  panZoom(svg);
  svg.kilnPanZoom.fit(width, height, 0);
}

// Shows a new drawing: fitted, but never so small that its text cannot be
// read (READABLE_ZOOM).
export function showGraph(svg, width, height) {
  panZoom(svg);
  svg.kilnPanZoom.fit(width, height, READABLE_ZOOM);
}

// The index of the box an event happened on, or -1.
export function boxAt(event) {
  const target = event.target instanceof Element ? event.target.closest("[data-box]") : null;
  return target ? Number(target.getAttribute("data-box")) : -1;
}

// Gives `className` to exactly the elements of `root` matching `selector`
// (none for an empty selector).
export function markOnly(root, className, selector) {
  for (const el of root.querySelectorAll(`.${className}`)) el.classList.remove(className);
  if (selector) for (const el of root.querySelectorAll(selector)) el.classList.add(className);
}
