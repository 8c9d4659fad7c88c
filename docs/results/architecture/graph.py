"""Rooms (top-level modules and packages of spectune), arrows between them, floors, cycles;
plus file-level cycles. Usage: python graph.py SRC_DIR"""
import ast, sys, pathlib, collections
src = pathlib.Path(sys.argv[1]) / "spectune"
files = {}
for f in src.rglob("*.py"):
    mod = "spectune." + ".".join(f.relative_to(src).with_suffix("").parts)
    mod = mod.removesuffix(".__init__")
    files[mod] = f
def room(m):
    parts = m.split(".")
    return parts[1] if len(parts) > 1 else "spectune"
edges = collections.defaultdict(set); fedges = collections.defaultdict(set)
for m, f in files.items():
    tree = ast.parse(f.read_text())
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("spectune"):
            names = [node.module] + [node.module + "." + a.name for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("spectune")]
        for n in names:
            if n in files:
                fedges[m].add(n)
                if room(n) != room(m) and room(n) != "spectune":
                    edges[room(m)].add(room(n))
rooms = {room(m) for m in files} - {"spectune"}
loose = sorted(r for r in rooms if (src / (r + ".py")).exists())
def sccs(g, nodes):
    idx = {}; low = {}; st = []; on = set(); out = []; c = [0]
    sys.setrecursionlimit(10000)
    def s(v):
        idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
        for w in g.get(v, ()):
            if w not in idx: s(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v: break
            out.append(comp)
    for v in nodes:
        if v not in idx: s(v)
    return [x for x in out if len(x) > 1]
rc = sccs(edges, rooms); fc = sccs(fedges, files)
floor = {}
def fl(r, seen=()):
    if r in floor: return floor[r]
    if r in seen: return 0
    floor[r] = 1 + max((fl(n, seen + (r,)) for n in edges.get(r, ())), default=0)
    return floor[r]
for r in rooms: fl(r)
print(f"rooms {len(rooms)} arrows {sum(len(v) for v in edges.values())} floors {max(floor.values())} loose {len(loose)} {loose} room-cycles {rc} file-cycles {len(fc)}")
