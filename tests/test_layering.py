"""The code base's layering: the library never imports the tools, the installed package names are unambiguous, and
variants are chosen through the head and scheme registries rather than string switches."""
import ast
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
LIBRARY = REPO / "gr_jax"


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
    make every new head or scheme edit other modules; heads and schemes are registries (gr_jax.heads,
    gr_jax.docids.scheme)."""
    found = [f"{path.relative_to(REPO)}:{number}" for path in [*LIBRARY.rglob("*.py"), *(REPO / "tasks").rglob("*.py")]
             for number, line in enumerate(path.read_text().splitlines(), start=1)
             if any(pattern in line for pattern in ("decoder_head ==", "decoder_head in (", "docid_scheme ==",
                                                    "_REGISTERED"))]
    assert found == []
