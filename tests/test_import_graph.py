"""The package's modules import one another without cycles, counting imports inside functions too: a
cycle is a module that cannot be read without the other, however late the import."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "specsample_cupy"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def _edges(mods) -> dict[str, set]:
    edges = {name: set() for name in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = {f"{node.module}.{a.name}" for a in node.names} & mods.keys()
                targets = subs or {node.module}
            elif isinstance(node, ast.Import):
                targets = {a.name for a in node.names}
            else:
                continue
            edges[name] |= (targets & mods.keys()) - {name}
    return edges


def _cycle(edges):
    """One cycle as a list of modules, or None (depth-first search, colours)."""
    colour, parent = {}, {}
    for start in edges:
        if start in colour:
            continue
        stack = [(start, iter(sorted(edges[start])))]
        colour[start] = "grey"
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = "black"
                stack.pop()
            elif colour.get(child) == "grey":
                path = [node]
                while path[-1] != child:
                    path.append(parent[path[-1]])
                return path[::-1]
            elif child not in colour:
                colour[child], parent[child] = "grey", node
                stack.append((child, iter(sorted(edges[child]))))
    return None


def test_no_import_cycles():
    assert _cycle(_edges(_modules())) is None


def test_the_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) in (["a", "b", "c"], ["b", "c", "a"],
                                                                       ["c", "a", "b"])


ROOT = PACKAGE.parent


def _defined(path: Path) -> set:
    """The names a module defines at its top level (assignments, defs, classes, imports) and those its
    __all__ promises (a module-level __getattr__ may provide them)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
                if isinstance(target, ast.Name) and target.id == "__all__":
                    names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):
            names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            names |= {(a.asname or a.name).split(".")[0] for n in ast.walk(node)
                      if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    return names


def test_every_import_of_the_package_resolves():
    """Every `import specsample_cupy.X` and `from specsample_cupy.X import Y` in the package, the tests, the
    benchmarks, models/ and cli.py names a module that exists and a name it defines, read statically: code
    that only runs on a GPU is checked too."""
    mods = _modules()
    files = [p for d in ("specsample_cupy", "tests", "benchmarks", "models") for p in (ROOT / d).rglob("*.py")]
    missing = []
    for path in files + [ROOT / "cli.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                missing += [(path.name, a.name) for a in node.names
                            if a.name.startswith("specsample_cupy.") and a.name not in mods
                            and not a.name.startswith(("specsample_cupy.kernels_cu", "specsample_cupy.models"))]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                    and node.module.split(".")[0] == "specsample_cupy":
                if node.module not in mods:
                    missing.append((path.name, node.module))
                    continue
                defined = _defined(mods[node.module])
                missing += [(path.name, f"{node.module}.{a.name}") for a in node.names
                            if a.name not in defined and f"{node.module}.{a.name}" not in mods]
    assert not missing
