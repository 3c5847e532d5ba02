"""The runtime's layers, bottom to top: the settings (config, env_names, meta,
context), messaging (net/), backends (backends/), processes as jobs
(processes/), the primitives (primitives/: queues, pipes, synchronize, ring...;
pool/ and managers/), the API (runtime/__init__, and multiprocessing's module
names at the root, which re-export the primitives).  Every module is in one
layer, and none imports one of a layer above its own."""
import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parent.parent / "fiberrl" / "runtime"
LAYERS = ["settings", "net", "backends", "processes", "primitives", "api"]
SETTINGS = ("config", "env_names", "meta", "context")
# multiprocessing's module names (fiberrl.runtime.connection as multiprocessing.connection): part of the API
MIRRORS = ("connection", "queues", "sharedctypes", "synchronize")
FOLDERS = {"net": "net", "backends": "backends", "processes": "processes", "primitives": "primitives",
           "pool": "primitives", "managers": "primitives"}


def module_name(path: Path) -> str:
    parts = path.relative_to(RUNTIME.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    inside = module.removeprefix("fiberrl.runtime").lstrip(".")
    if not inside:
        return "api"
    top = inside.split(".")[0]
    if top in SETTINGS:
        return "settings"
    if top in MIRRORS:
        return "api"
    if top in FOLDERS:
        return FOLDERS[top]
    raise AssertionError(f"{module} is in no layer: put it in its layer's folder, or name it in tests/test_layers.py")


def imports_of(path: Path):
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    known = {module_name(p) for p in RUNTIME.rglob("*.py")}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                name = f"{target}.{alias.name}"
                yield node.lineno, name if name in known else target
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def test_every_runtime_module_is_in_a_layer():
    for path in sorted(RUNTIME.rglob("*.py")):
        layer_of(module_name(path))


def test_multiprocessing_s_module_names_only_re_export_the_primitives():
    """A root module named after multiprocessing's holds nothing of its own: what it
    names is in primitives/, where the runtime's own modules import it from."""
    for name in MIRRORS:
        tree = ast.parse((RUNTIME / f"{name}.py").read_text())
        docstring, *body = tree.body
        assert isinstance(docstring, ast.Expr) and isinstance(docstring.value, ast.Constant), name
        for node in body:
            re_export = isinstance(node, ast.ImportFrom) and node.level == 1 and node.module.startswith("primitives.")
            all_names = isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["__all__"]
            assert re_export or all_names, f"{name}.py:{node.lineno} is more than a re-export"


def test_no_runtime_module_imports_a_layer_above_its_own():
    upward = []
    for path in sorted(RUNTIME.rglob("*.py")):
        mine = LAYERS.index(layer_of(module_name(path)))
        for line, target in imports_of(path):
            if target.startswith("fiberrl.runtime") and LAYERS.index(layer_of(target)) > mine:
                upward.append(f"{path.relative_to(RUNTIME)}:{line} ({layer_of(module_name(path))}) imports {target} "
                              f"({layer_of(target)})")
    assert not upward, "\n".join(upward)


def test_the_settings_name_every_backend_there_is():
    from fiberrl.runtime.backends import BACKENDS
    from fiberrl.runtime.config import BACKEND_NAMES
    assert tuple(BACKENDS) == BACKEND_NAMES


def fiberrl_imports(folder: Path):
    """(file, line, module) of each fiberrl module imported by the files in ``folder``."""
    for path in sorted(folder.rglob("*.py")):
        module = ".".join(path.relative_to(RUNTIME.parent.parent).with_suffix("").parts)
        package = module.rpartition(".")[0] if path.name != "__init__.py" else module.removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)] if node.level else []
                target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
                yield path, node.lineno, target or ""
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, node.lineno, alias.name


def test_the_runtime_imports_nothing_of_fiberrl_outside_it_and_the_rl_pieces_nothing_of_the_app():
    outside = [f"{p.name}:{line} imports {target}" for p, line, target in fiberrl_imports(RUNTIME)
               if target.startswith("fiberrl") and not target.startswith("fiberrl.runtime")]
    app = [f"{p.name}:{line} imports {target}" for p, line, target in fiberrl_imports(RUNTIME.parent / "rl")
           if target.startswith("fiberrl") and not target.startswith(("fiberrl.runtime", "fiberrl.rl"))]
    assert not outside and not app, "\n".join(outside + app)
