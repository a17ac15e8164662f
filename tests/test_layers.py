"""The library's imports flow down a stack of layers (docs/library.md): no module imports one
from a higher layer, and no group of modules imports itself round a cycle. Every import counts,
function-level ones included; the planted cases show that the check catches both faults."""
import ast
from pathlib import Path

LAB = Path(__file__).resolve().parent.parent / "lab"

# The layer of each module or package, by its longest matching dotted prefix (docs/library.md).
LAYERS = {
    "lab": 7, "lab.__main__": 7, "lab.cli": 7,
    "lab.paths": 0, "lab.errors": 0, "lab.options": 0, "lab.artifacts": 0,
    "lab.sampling": 0, "lab.theory": 0, "lab.intervals": 0, "lab.trees": 0, "lab.timing": 0, "lab.steps": 0,
    "lab.target": 1, "lab.verify": 1, "lab.kernels": 1,
    "lab.data": 2, "lab.decode": 2, "lab.batched": 2,
    "lab.drafters": 3, "lab.measure": 3, "lab.simulate": 3,
    "lab.costmodel": 4, "lab.judge": 4,
    "lab.train": 5, "lab.bench": 5,
    "lab.viz": 6,
    "lab.results": 7, "lab.inventory": 7, "lab.figures": 7, "lab.exercises": 7, "lab.check": 7, "lab.book": 7,
}


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the package folder `root`."""
    found = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its file."""
    known = modules(root)
    graph = {name: set() for name in known}
    for name, path in known.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                stem = ".".join(base + ([node.module] if node.module else []))
                targets = [stem] + [f"{stem}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in known and t != name and not name.startswith(t + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def layer(name: str, layers: dict[str, int]) -> int:
    matches = [prefix for prefix in layers if name == prefix or name.startswith(prefix + ".")]
    if not matches:
        raise AssertionError(f"{name} has no layer: add it to LAYERS and to docs/library.md")
    return layers[max(matches, key=len)]


def upward(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    """Every import of a module from a higher layer, as 'importer (layer) -> imported (layer)'."""
    return sorted(f"{a} (L{layer(a, layers)}) -> {b} (L{layer(b, layers)})"
                  for a, targets in graph.items() for b in targets if layer(b, layers) > layer(a, layers))


def test_no_import_cycles():
    assert cycles(imports(LAB)) == []


def test_no_module_imports_from_a_higher_layer():
    assert upward(imports(LAB), LAYERS) == []


def planted(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "lab"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_planted_cycle_through_a_function_level_import_is_found(tmp_path):
    root = planted(tmp_path, {"__init__.py": "", "a.py": "from . import b\n",
                              "pkg/__init__.py": "", "pkg/b.py": "", "b.py": "def f():\n    from .a import x\n"})
    assert cycles(imports(root)) == [["lab.a", "lab.b"]]


def test_a_planted_upward_import_is_found(tmp_path):
    root = planted(tmp_path, {"__init__.py": "", "low.py": "def f():\n    from lab.high import g\n",
                              "high.py": "from .low import f\n"})
    assert upward(imports(root), {"lab": 7, "lab.low": 0, "lab.high": 3}) == ["lab.low (L0) -> lab.high (L3)"]


# Where a module of the lab may be imported inside a function: the Triton kernels (an optional
# dependency a CPU without Triton must not load).
LAZY_ALLOWED = {"lab/decode.py": {"lab.kernels"}}


def lazy_lab_imports(root: Path) -> list[str]:
    """`file: module` for each import of a lab module inside a function, less those allowed."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = str(path.relative_to(root.parent))
        package = ".".join(path.relative_to(root.parent).with_suffix("").parts[:-1])
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("lab")):
                    base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                    module = ".".join(base + ([node.module] if node.module else []))
                    if not any(module.startswith(a) for a in LAZY_ALLOWED.get(relative, ())):
                        found.append(f"{relative}: {module}")
    return found


def test_lab_modules_are_imported_at_the_top():
    assert lazy_lab_imports(LAB) == []


def test_a_lab_import_inside_a_function_fails(tmp_path):
    root = tmp_path / "lab"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "low.py").write_text("def f():\n    from .high import g\n    return g\n")
    assert lazy_lab_imports(root) == ["lab/low.py: lab.high"]
