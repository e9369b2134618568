// The graph's layered layout (dagre), run in its own Web Worker
// (`layout-worker.js`, bundled by `cargo xtask web` as `layout.js`) so
// that laying out a graph of thousands of boxes never freezes the page.
// Pure: no DOM, so node can run it too.
import dagre from "@dagrejs/dagre";

// Past this many boxes one dagre layout is too slow for a page (its
// crossing reduction needs over a minute for 2,000 boxes of a wide graph,
// and its recursive passes overflow the stack on a chain of 2,000), so a
// large graph is laid out in bands (see `banded`).
const LARGE = 400;
// A band holds at most this many units (boxes or clusters) and ranks.
const BAND = 150;
// In a large graph, an edge spanning more ranks than this is not routed
// by dagre (each rank crossed costs it a dummy node: a constant read by
// 1,000 ops would cost a million) but drawn straight, as a `long` edge.
const LONG_SPAN = 8;

// One dagre layout of `ids` (with sizes from `size`) and `edges` between
// them; returns dagre's graph.
function layered(ids, size, edges, large) {
  const g = new dagre.graphlib.Graph({ multigraph: false });
  g.setGraph({
    rankdir: "TB", nodesep: 14, ranksep: 34, edgesep: 6, marginx: 12, marginy: 12,
    // Network simplex ranking is quadratic; a band takes the longest path.
    ranker: large ? "longest-path" : "network-simplex",
  });
  g.setDefaultEdgeLabel(() => ({}));
  for (const id of ids) g.setNode(id, size(id));
  for (const [from, to] of edges) if (from !== to) g.setEdge(from, to);
  dagre.layout(g, large ? { disableOptimalOrderHeuristic: true } : {});
  return g;
}

// Each id's rank in the DAG `ids`/`edges`: the longest path from a source,
// except that a source sits just above its first consumer (an input or a
// constant read late is drawn where it is read). Iterative: the graphs
// are deep.
function ranks(ids, edges) {
  const index = new Map(ids.map((id, i) => [id, i]));
  const next = ids.map(() => []);
  const indegree = ids.map(() => 0);
  for (const [from, to] of edges) {
    if (from === to) continue;
    next[index.get(from)].push(index.get(to));
    indegree[index.get(to)] += 1;
  }
  const sources = indegree.map((d) => d === 0);
  const rank = ids.map(() => 0);
  const queue = [];
  indegree.forEach((d, i) => d === 0 && queue.push(i));
  for (let head = 0; head < queue.length; head += 1) {
    const u = queue[head];
    for (const v of next[u]) {
      rank[v] = Math.max(rank[v], rank[u] + 1);
      indegree[v] -= 1;
      if (indegree[v] === 0) queue.push(v);
    }
  }
  sources.forEach((isSource, u) => {
    if (isSource && next[u].length) rank[u] = next[u].reduce((low, v) => Math.min(low, rank[v]), Infinity) - 1;
  });
  return new Map(ids.map((id, i) => [id, rank[i]]));
}

// A large graph's layout: its units ranked (see `ranks`), cut into bands
// of consecutive ranks, each band laid out by dagre on its own and the
// bands stacked top to bottom. Edges between bands, and edges longer than
// LONG_SPAN ranks, are left to the caller. Returns { width, height,
// node(id) -> { x, y }, edge(from, to) -> { points } | undefined }.
function banded(ids, size, edges) {
  const rank = ranks(ids, edges);
  const byRank = [...ids].sort((a, b) => rank.get(a) - rank.get(b));
  const bands = [];
  let current = null;
  for (const id of byRank) {
    const r = rank.get(id);
    const full = current && current.ids.length >= BAND && r !== current.last;
    if (!current || full || r - current.first >= BAND) {
      current = { ids: [], first: r, last: r };
      bands.push(current);
    }
    current.ids.push(id);
    current.last = r;
  }
  const bandOf = new Map();
  bands.forEach((band, k) => band.ids.forEach((id) => bandOf.set(id, k)));
  const routed = (from, to) => bandOf.get(from) === bandOf.get(to)
    && Math.abs(rank.get(to) - rank.get(from)) <= LONG_SPAN;
  const placed = bands.map((band) => layered(
    band.ids, size, edges.filter(([f, t]) => bandOf.get(f) === bandOf.get(band.ids[0]) && routed(f, t)), true,
  ));
  const width = Math.max(...placed.map((g) => g.graph().width ?? 0));
  const offsets = [];
  let height = 0;
  for (const g of placed) {
    offsets.push([(width - (g.graph().width ?? 0)) / 2, height]);
    height += g.graph().height ?? 0;
  }
  return {
    width,
    height,
    node(id) {
      const k = bandOf.get(id);
      const n = placed[k].node(id);
      return { x: n.x + offsets[k][0], y: n.y + offsets[k][1] };
    },
    edge(from, to) {
      if (!routed(from, to)) return undefined;
      const k = bandOf.get(from);
      const e = placed[k].edge(from, to);
      return e && { points: e.points.map((p) => ({ x: p.x + offsets[k][0], y: p.y + offsets[k][1] })) };
    },
  };
}

// The whole-graph layout of `ids`: one dagre layout, or bands for a large
// graph; the same interface as `banded`'s result.
function outerLayout(ids, size, edges, large) {
  if (large) return banded(ids, size, edges);
  const g = layered(ids, size, edges, false);
  return {
    width: g.graph().width ?? 0,
    height: g.graph().height ?? 0,
    node: (id) => g.node(id),
    edge: (from, to) => g.edge(from, to),
  };
}

// Places a graph with dagre's layered (Sugiyama) layout. `input` is
// { boxes: [{ width, height, cluster }], clusters: count, titles: [least width
// of each cluster, for its title], edges: [[from, to]] };
// returns { width, height, boxes: [[x, y]], clusters: [[x, y, w, h]],
// edges: [[[x, y], ...]], long: [edge index] } in input order (x, y are
// centres; `long` lists the edges drawn straight, not routed).
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
  const inner = members.map((ids, k) => {
    const inside = new Set(ids);
    const edges = input.edges.filter(([f, t]) => inside.has(f) && inside.has(t));
    const g = layered(ids.map(String), (id) => input.boxes[Number(id)], edges.map(([f, t]) => [String(f), String(t)]), false);
    const label = g.graph();
    // Room for the cluster's title above its members.
    return { g, width: Math.max(label.width, (input.titles && input.titles[k]) || 0), height: label.height + 16 };
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
  const outerEdges = [];
  const seen = new Set();
  for (const [f, t] of input.edges) {
    const key = `${outerId(f)} ${outerId(t)}`;
    if (outerId(f) !== outerId(t) && !seen.has(key)) {
      seen.add(key);
      outerEdges.push([outerId(f), outerId(t)]);
    }
  }
  const outer = outerLayout(ids, size, outerEdges, large);
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
  const long = [];
  const edges = input.edges.map(([from, to], index) => {
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
    long.push(index);
    return [boxes[from], boxes[to]];
  });
  return { width: outer.width, height: outer.height, boxes, clusters, edges, long };
}
