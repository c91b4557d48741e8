"""The code base's layering: the library's import graph (function-local imports included) points down its layers
only and has no cycle, the library never imports the tools, the installed package names are unambiguous, and
variants are chosen through the head and scheme registries rather than string switches. Today's layer violations
are listed by name, so that none is added and each fixed one is struck off (`KNOWN_UPWARD`, `KNOWN_CYCLES` may only
shrink; see docs/architecture.md)."""
import ast
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
LIBRARY = REPO / "gr_jax"
# Installed names of the repository's folders (setup.py's package_dir).
PACKAGES = {"gr_jax": "gr_jax", "tasks": "gr_jax.tasks", "tools": "gr_jax.tools"}

# Bottom to top: a module may import its own layer and the layers below. A name covers its package's modules.
LAYERS = {
    "base": ["gr_jax", "gr_jax.logs", "gr_jax.run_dir", "gr_jax.partitioning", "gr_jax.metrics",
             "gr_jax.metric_writers",
             # The families' package docstrings, which import nothing.
             *(f"gr_jax.{family}" for family in ("dense", "gdr", "ngrams", "ranking", "scaling"))],
    "data": ["gr_jax.vocabulary", "gr_jax.data", "gr_jax.docids", "gr_jax.tasks", "gr_jax.evaluation", "gr_jax.fusion",
             "gr_jax.significance",
             "gr_jax.encoders", "gr_jax.ngrams.index", "gr_jax.ngrams.spans", "gr_jax.ranking.targets",
             "gr_jax.ranking.metrics", "gr_jax.ranking.data",
             "gr_jax.gdr.clusters", "gr_jax.gdr.index", "gr_jax.dense.index", "gr_jax.dense.similarity",
             "gr_jax.scaling.laws"],
    "model": ["gr_jax.lora", "gr_jax.network", "gr_jax.tower_encoder", "gr_jax.heads", "gr_jax.losses", "gr_jax.models",
              "gr_jax.decoding", "gr_jax.layer_layout", "gr_jax.candidates", "gr_jax.pretrained", "gr_jax.dense.model",
              "gr_jax.dense.losses", "gr_jax.dense.towers", "gr_jax.dense.spectral", "gr_jax.gdr.model",
              "gr_jax.gdr.losses", "gr_jax.ranking.baselines"],
    "training": ["gr_jax.optimizers", "gr_jax.trainer", "gr_jax.checkpoints", "gr_jax.warm_start",
                 "gr_jax.dense.data", "gr_jax.dense.run_tower", "gr_jax.gdr.data"],
    "retrieval": ["gr_jax.retrievers", "gr_jax.evaluator"],
    "experiment": ["gr_jax.family", "gr_jax.experiment", "gr_jax.dense.experiment", "gr_jax.gdr.experiment",
                   "gr_jax.ngrams.experiment", "gr_jax.training", "gr_jax.actions", "gr_jax.dense.calibration",
                   "gr_jax.scaling.cgl", "gr_jax.ranking.evaluation"],
    "entry": ["gr_jax.train", "gr_jax.eval", "gr_jax.infer", "gr_jax.search", "gr_jax.cli", "gr_jax.cgl",
              "gr_jax.ranking_eval", "gr_jax.entry_point", "gr_jax.gin_utils", "gr_jax.tools"],
}
ORDER = list(LAYERS)
# A new model family's package (gr_jax/<family>/, e.g. a decoder-only LLM) needs no entry above: its package docstring
# is in the base layer and each of its modules takes the layer of its role, named as the existing families name them.
FAMILY_ROLES = {"experiment": "experiment", "retriever": "retrieval", "data": "training", "model": "model",
                "towers": "model", "losses": "model", "network": "model", "pretrained": "model", "index": "data"}
EXACT = set(LAYERS["base"])  # the base layer names packages' __init__ modules, not what they contain

# (importer, imported) pairs that point up today, to be removed as the layers are sorted out.
KNOWN_UPWARD: set[tuple[str, str]] = set()
# Each import cycle today, as the sorted names of its modules (none: the network's output head, which builds on the
# network's layers, is given to it where the model is built rather than looked up from its config).
KNOWN_CYCLES: set[tuple[str, ...]] = set()


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    parts[0] = PACKAGES[parts[0]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def library_modules() -> dict[str, pathlib.Path]:
    return {module_name(path): path for folder in PACKAGES for path in sorted((REPO / folder).rglob("*.py"))}


def import_graph(modules: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    """Module -> the library modules it imports anywhere in its file (top level, functions, TYPE_CHECKING): for
    `from P import name`, the module P.name where there is one, else P (its __init__ or module defines `name`)."""

    def installed(name: str) -> str:
        for folder, package in PACKAGES.items():
            if name == folder or name.startswith(folder + "."):
                return package + name[len(folder):]
        return name

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [installed(alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], base]).strip(".")
                base = installed(base)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            else:
                continue
            for target in targets:
                resolved = resolve(target) if target.split(".")[0] == "gr_jax" else None
                if resolved and resolved != name:
                    imported.add(resolved)
        graph[name] = imported
    return graph


def layer_of(module: str) -> str:
    """The layer of the longest name that is `module` or a package above it (the base layer's: exactly)."""
    best = None
    for layer, prefixes in LAYERS.items():
        for prefix in prefixes:
            named = module == prefix or (prefix not in EXACT and module.startswith(prefix + "."))
            if named and (best is None or len(prefix) > best[1]):
                best = (layer, len(prefix))
    if best is None:
        parts = module.split(".")
        if parts[0] == "gr_jax" and len(parts) == 2 and not (LIBRARY / f"{parts[1]}.py").exists():
            return "base"  # a package's __init__
        if parts[0] == "gr_jax" and len(parts) == 3 and parts[2] in FAMILY_ROLES:
            return FAMILY_ROLES[parts[2]]
        raise AssertionError(f"{module} is in no layer: add it to LAYERS (or name a family's module by its role, "
                             f"{sorted(FAMILY_ROLES)})")
    return best[0]


def test_a_new_familys_package_takes_its_layers_from_its_modules_roles():
    assert [layer_of(f"gr_jax.llm{role}") for role in ("", ".data", ".model", ".retriever", ".experiment")] == [
        "base", "training", "model", "retrieval", "experiment"]
    with pytest.raises(AssertionError, match="gr_jax.llm.helpers is in no layer"):
        layer_of("gr_jax.llm.helpers")


def cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], set(), [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(tuple(sorted(component)))
    return found


@pytest.fixture(scope="module")
def graph():
    return import_graph(library_modules())


def _imported_modules(path: pathlib.Path) -> set[str]:
    """Every module a file imports, absolute names (`from gr_jax import tools` gives gr_jax.tools)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_library_and_the_tasks_never_import_the_tools():
    offenders = {}
    for path in [*LIBRARY.rglob("*.py"), *(REPO / "tasks").rglob("*.py")]:
        tools = sorted(name for name in _imported_modules(path)
                       if name == "gr_jax.tools" or name.startswith(("gr_jax.tools.", "tools")))
        if tools:
            offenders[str(path.relative_to(REPO))] = tools
    assert not offenders
    assert len(list(LIBRARY.rglob("*.py"))) > 30  # the scan saw the library


def test_installed_names_are_under_gr_jax_only():
    """Outside the repository (no checkout on sys.path), `tasks` and `tools` are not importable top-level packages;
    the folders are `gr_jax.tasks` and `gr_jax.tools`."""
    probe = ("import importlib.util as u, json; print(json.dumps([u.find_spec(n) is not None for n in "
             "('tasks', 'tools', 'gr_jax.tasks', 'gr_jax.tools', 'gr_jax.tools.bench.decode')]))")
    out = subprocess.run([sys.executable, "-c", probe], cwd="/", capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[false, false, true, true, true]"


def test_variants_are_chosen_through_registries_not_string_switches():
    """`decoder_head ==` / `docid_scheme ==` comparisons and a module-global round trip of registered numbers would
    make every new head or scheme edit other modules; a head is its own gin configurable (gr_jax.heads) and schemes are
    a registry (gr_jax.docids.scheme)."""
    found = [f"{path.relative_to(REPO)}:{number}" for path in [*LIBRARY.rglob("*.py"), *(REPO / "tasks").rglob("*.py")]
             for number, line in enumerate(path.read_text().splitlines(), start=1)
             if any(pattern in line for pattern in ("decoder_head ==", "decoder_head in (", "docid_scheme ==",
                                                    "_REGISTERED"))]
    assert found == []


def test_every_module_has_a_layer(graph):
    for module in graph:
        layer_of(module)


def test_layers_point_down_only(graph):
    upward = {(module, imported) for module, imports in graph.items() for imported in imports
              if ORDER.index(layer_of(imported)) > ORDER.index(layer_of(module))}
    assert not upward - KNOWN_UPWARD, f"imports from a lower layer to a higher one: {sorted(upward - KNOWN_UPWARD)}"
    assert not KNOWN_UPWARD - upward, f"fixed, strike off KNOWN_UPWARD: {sorted(KNOWN_UPWARD - upward)}"


def test_no_import_cycles(graph):
    found = cycles(graph)
    assert not found - KNOWN_CYCLES, f"import cycles: {sorted(found - KNOWN_CYCLES)}"
    assert not KNOWN_CYCLES - found, f"fixed, strike off KNOWN_CYCLES: {sorted(KNOWN_CYCLES - found)}"


def test_the_graph_is_read_as_python_resolves_it(tmp_path):
    """A hand-made package: absolute, relative and function-local imports, and a name from a package's __init__."""
    files = {"gr_jax/__init__.py": "", "gr_jax/a.py": "from gr_jax import b\n",
             "gr_jax/b.py": "def f():\n    from gr_jax.pkg import c\n", "gr_jax/pkg/__init__.py": "X = 1\n",
             "gr_jax/pkg/c.py": "from . import d\nfrom gr_jax.pkg import X\nimport gr_jax.a\n", "gr_jax/pkg/d.py": ""}
    modules = {}
    for relative, text in files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        name = relative.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        modules[name] = path
    graph = import_graph(modules)
    assert graph == {"gr_jax": set(), "gr_jax.a": {"gr_jax.b"}, "gr_jax.b": {"gr_jax.pkg.c"}, "gr_jax.pkg": set(),
                     "gr_jax.pkg.c": {"gr_jax.pkg.d", "gr_jax.pkg", "gr_jax.a"}, "gr_jax.pkg.d": set()}
    assert cycles(graph) == {("gr_jax.a", "gr_jax.b", "gr_jax.pkg.c")}
    assert layer_of("gr_jax.dense.model") == "model" and layer_of("gr_jax.dense.data") == "training"
    assert layer_of("gr_jax.tools.bench.accelerator") == "entry" and layer_of("gr_jax.dense") == "base"
