// The page's JavaScript half, bundled by `cargo xtask web` (esbuild) with
// the npm packages it imports into one file, `views.js`, that index.html
// loads before the wasm module. It does what libraries do best and Rust's
// UI calls it: the code editor (CodeMirror 6), the graph's layered layout
// (dagre), pan and zoom of the drawing, and marking boxes by class. It
// holds no compiler facts: the Rust side hands it boxes and sizes.
import { EditorState, StateEffect, StateField, Prec, Annotation } from "@codemirror/state";
import {
  EditorView, Decoration, keymap, lineNumbers, highlightActiveLine,
  highlightActiveLineGutter, drawSelection,
} from "@codemirror/view";
import { defaultKeymap, history, historyKeymap, indentWithTab } from "@codemirror/commands";
import {
  syntaxHighlighting, defaultHighlightStyle, bracketMatching, indentOnInput,
} from "@codemirror/language";
import { javascript } from "@codemirror/lang-javascript";
import { setDiagnostics, lintGutter } from "@codemirror/lint";
import { searchKeymap, highlightSelectionMatches } from "@codemirror/search";
import dagre from "@dagrejs/dagre";

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
        // Rhai reads like JavaScript closely enough for highlighting.
        javascript(),
        syntaxHighlighting(defaultHighlightStyle, { fallback: true }),
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

// ----- graph ----------------------------------------------------------

// Past this many boxes dagre's iterative crossing reduction takes longer
// than a page may freeze (over a minute at 2,000 boxes of a wide graph):
// large graphs keep the order of its first sweep.
const LARGE = 400;

// One dagre layout of `ids` (with sizes from `size`) and `edges` between
// them; returns dagre's graph.
function layered(ids, size, edges, large) {
  const g = new dagre.graphlib.Graph({ multigraph: false });
  g.setGraph({ rankdir: "TB", nodesep: 14, ranksep: 34, edgesep: 6, marginx: 12, marginy: 12 });
  g.setDefaultEdgeLabel(() => ({}));
  for (const id of ids) g.setNode(id, size(id));
  for (const [from, to] of edges) if (from !== to) g.setEdge(from, to);
  dagre.layout(g, large ? { disableOptimalOrderHeuristic: true } : {});
  return g;
}

// Places a graph with dagre's layered (Sugiyama) layout. `input` is
// { boxes: [{ width, height, cluster }], clusters: count, edges: [[from, to]] };
// returns { width, height, boxes: [[x, y]], clusters: [[x, y, w, h]],
// edges: [[[x, y], ...]] } in input order (x, y are centres).
//
// Clusters are laid out in two levels, each by dagre: a cluster's members
// first, on their own, then the whole graph with each cluster as one box
// of the size its members took (dagre's compound layout needs minutes and
// gigabytes for the hundreds of clusters of a large graph).
export function layoutGraph(input) {
  const large = input.boxes.length > LARGE;
  const members = Array.from({ length: input.clusters }, () => []);
  input.boxes.forEach((b, i) => {
    if (b.cluster !== null && b.cluster !== undefined) members[b.cluster].push(i);
  });
  const inner = members.map((ids) => {
    const inside = new Set(ids);
    const edges = input.edges.filter(([f, t]) => inside.has(f) && inside.has(t));
    const g = layered(ids.map(String), (id) => input.boxes[Number(id)], edges.map(([f, t]) => [String(f), String(t)]), false);
    const label = g.graph();
    // Room for the cluster's title above its members.
    return { g, width: label.width, height: label.height + 16 };
  });
  const outerId = (i) => {
    const c = input.boxes[i].cluster;
    return c === null || c === undefined ? `b${i}` : `c${c}`;
  };
  const ids = [];
  input.boxes.forEach((b, i) => {
    if (b.cluster === null || b.cluster === undefined) ids.push(`b${i}`);
  });
  for (let c = 0; c < input.clusters; c += 1) ids.push(`c${c}`);
  const size = (id) => (id[0] === "c" ? inner[Number(id.slice(1))] : input.boxes[Number(id.slice(1))]);
  const outer = layered(ids, size, input.edges.map(([f, t]) => [outerId(f), outerId(t)]), large);
  const clusters = inner.map((c, k) => {
    const n = outer.node(`c${k}`);
    return [n.x, n.y, c.width, c.height];
  });
  // Where a cluster's member lands: its place inside, moved with the frame.
  const place = (i) => {
    const c = input.boxes[i].cluster;
    if (c === null || c === undefined) {
      const n = outer.node(`b${i}`);
      return [n.x, n.y];
    }
    const [x, y, w, h] = clusters[c];
    const n = inner[c].g.node(String(i));
    return [x - w / 2 + n.x, y - h / 2 + 16 + n.y];
  };
  const boxes = input.boxes.map((_, i) => place(i));
  const edges = input.edges.map(([from, to]) => {
    const a = input.boxes[from].cluster;
    const b = input.boxes[to].cluster;
    if (a !== null && a !== undefined && a === b) {
      const [x, y, w, h] = clusters[a];
      const e = inner[a].g.edge(String(from), String(to));
      if (e) return e.points.map((p) => [x - w / 2 + p.x, y - h / 2 + 16 + p.y]);
    } else {
      const e = outer.edge(outerId(from), outerId(to));
      // The outer edge ends on the frame; draw it on to the member box.
      if (e) return [boxes[from], ...e.points.slice(1, -1).map((p) => [p.x, p.y]), boxes[to]];
    }
    return [boxes[from], boxes[to]];
  });
  const graph = outer.graph();
  return { width: graph.width ?? 0, height: graph.height ?? 0, boxes, clusters, edges };
}

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
    drag = { x: e.clientX - state.x, y: e.clientY - state.y };
    svg.setPointerCapture(e.pointerId);
  });
  svg.addEventListener("pointermove", (e) => {
    if (!drag) return;
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
    // Scales the whole drawing (width, height) into the view, at most 1:1.
    fit(width, height) {
      const r = svg.getBoundingClientRect();
      state.k = Math.min(1, r.width / Math.max(width, 1), r.height / Math.max(height, 1));
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

// Fits the drawing in `svg`'s view.
export function fitGraph(svg, width, height) {
  panZoom(svg);
  svg.kilnPanZoom.fit(width, height);
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
