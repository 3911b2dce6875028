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
