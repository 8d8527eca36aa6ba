"""The package's import structure, as numbers a refactor can be judged by.

    python scripts/import_graph.py [--package cl_zoo] [--json]

Reads every module under the package with :mod:`ast` (nothing is imported or run) and prints:

* internal import edges, split into module-level and function-level imports (an import inside a
  ``def``), and the function-level ones that re-import a module the file already imports at the top;
* import circles between modules (strongly connected components of the module graph, counting
  both kinds of import) with the files in each;
* "rooms" (a sub-package, or a module at the package root) and the arrows between them; an arrow
  is *upward* when its target room also reaches back to its source (the two lie on a circle), so a
  package without circles has none;
* the largest functions by line count.

Why ``ast`` rather than importing: a circle closed only through a function-level import is
invisible to ``sys.modules`` order, and that is the kind this script exists to count.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def resolve(node: ast.ImportFrom, current: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = current.split(".") if is_package else current.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def targets(node: ast.AST, current: str, is_package: bool, known: set[str]) -> list[str]:
    """The internal modules an import statement loads (``from a import b`` counts ``a.b`` if it is a module)."""
    found: list[str] = []
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = resolve(node, current, is_package)
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    else:
        return found
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != current:
            found.append(name)
    return found


def room_of(module: str, package: str, packages: set[str]) -> str:
    parts = module.split(".")
    if len(parts) >= 2 and ".".join(parts[:2]) in packages:
        return parts[1]
    return parts[1] if len(parts) >= 2 else "(root)"


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def analyse(package_dir: Path) -> dict:
    files = sorted(p for p in package_dir.rglob("*.py"))
    known = {module_name(p, package_dir) for p in files}
    packages = {module_name(p, package_dir) for p in files if p.name == "__init__.py"}
    package = package_dir.name
    graph: dict[str, set[str]] = defaultdict(set)
    top_edges = function_edges = 0
    function_statements: list[str] = []
    reimports: list[str] = []
    functions: list[tuple[int, str]] = []
    for path in files:
        current = module_name(path, package_dir)
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        graph[current]
        top_level: set[str] = set()
        for node in tree.body:
            for stmt in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
                top_level.update(targets(stmt, current, is_package, known))
        seen: set[int] = set()  # an import inside a nested def is walked from every enclosing def
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                span = (node.end_lineno or node.lineno) - node.lineno + 1
                functions.append((span, f"{path.relative_to(package_dir.parent)}:{node.lineno} {node.name}"))
                for inner in ast.walk(node):
                    if id(inner) in seen:
                        continue
                    seen.add(id(inner))
                    found = targets(inner, current, is_package, known)
                    if isinstance(inner, (ast.Import, ast.ImportFrom)):
                        function_statements.append(f"{path.relative_to(package_dir.parent)}:{inner.lineno}")
                    for target in found:
                        function_edges += 1
                        graph[current].add(target)
                        if target in top_level:
                            reimports.append(f"{path.relative_to(package_dir.parent)}:{inner.lineno} {target}")
        top_edges += len(top_level)
        graph[current].update(top_level)
    circles = [c for c in strongly_connected(graph) if len(c) > 1]
    rooms: dict[str, set[str]] = defaultdict(set)
    for source, ends in graph.items():
        for end in ends:
            a, b = room_of(source, package, packages), room_of(end, package, packages)
            if a != b:
                rooms[a].add(b)
        rooms[room_of(source, package, packages)]
    room_circles = [c for c in strongly_connected(rooms) if len(c) > 1]
    in_circle = {room: i for i, c in enumerate(room_circles) for room in c}
    upward = sorted(f"{a} -> {b}" for a, ends in rooms.items() for b in ends if a in in_circle and in_circle.get(b) == in_circle[a])
    functions.sort(reverse=True)
    return {
        "modules": len(files),
        "rooms": len(rooms),
        "room_arrows": sum(len(v) for v in rooms.values()),
        "upward_arrows": upward,
        "room_circles": room_circles,
        "module_edges": sum(len(v) for v in graph.values()),
        "top_level_import_edges": top_edges,
        "function_level_import_statements": len(function_statements),
        "function_level_import_edges": function_edges,
        "function_level_reimports": reimports,
        "module_circles": circles,
        "largest_functions": [f"{n} lines {where}" for n, where in functions[:5]],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default=str(Path(__file__).resolve().parents[1] / "cl_zoo"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = analyse(Path(args.package))
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{report['modules']} modules, {report['module_edges']} internal import edges "
          f"({report['top_level_import_edges']} at module level, {report['function_level_import_edges']} inside functions "
          f"from {report['function_level_import_statements']} statements; "
          f"{len(report['function_level_reimports'])} re-import a module the file imports at the top)")
    print(f"{report['rooms']} rooms, {report['room_arrows']} arrows between them, {len(report['upward_arrows'])} upward "
          f"(on a circle): {', '.join(report['upward_arrows']) or '-'}")
    for c in report["room_circles"]:
        print(f"room circle ({len(c)}): {', '.join(c)}")
    for c in report["module_circles"]:
        print(f"module circle ({len(c)} files): {', '.join(c)}")
    print("largest functions: " + "; ".join(report["largest_functions"][:3]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
