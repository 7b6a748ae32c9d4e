"""The shape of the code: one home per stage, imports that only point down, no shadowed submodules,
every exception in zoo.errors. Read from the source with ast, so a lazy import inside a function counts."""

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

import zoo
from zoo import errors

PACKAGE = Path(zoo.__file__).resolve().parent
# Lower layers first; a module may import only from its own layer or below. TYPE_CHECKING-only
# imports (annotations) are not imports at run time and are skipped.
LAYERS = [
    [
        "zoo.records",  # frozen records for the modules a search imports; imports nothing
        "zoo.errors",
        "zoo.constants",
        "zoo.columns",
        "zoo.throughput.roofline",
        "zoo.throughput.measured",
        "zoo.throughput.correction",
        "zoo.dtypes",
        "zoo.caching",
        "zoo.scoped",
    ],
    [
        "zoo.query",
        "zoo.recipe",
        "zoo.state",
        "zoo.inspection",
        "zoo.structure",
        "zoo.model_info",
        "zoo.planning",
        "zoo.fitting",  # search by fit: the plans of recorded rows
    ],
    ["zoo.meta", "zoo.offline", "zoo.weights", "zoo.construction", "zoo.load_options"],
    ["zoo.families"],  # timm_loader among them: the timm family records its loader arguments at index time
    ["zoo.build", "zoo.model_cache", "zoo.preprocess"],
    ["zoo.analysis", "zoo.materialize", "zoo.plain_tensors", "zoo.pretrained"],
    ["zoo.registry"],
    ["zoo.indexing"],  # the record of a row, the indexers, the hub listing
    ["zoo.load"],  # weights= resolved, .materialize and the lazy load: below the api, which binds them
    ["zoo.recording", "zoo.sizing"],  # bases of zoo.api.Zoo: its writes; scan, estimate and plan
    ["zoo.api", "zoo.throughput"],  # benchmark; roofline and measured (pure) sit in the first layer
    ["zoo", "zoo.cli", "zoo.web"],  # readers at the top: the CLI and the web catalog, both through zoo.api
]
MAX_LINES = 500  # as ruff formats them (one argument a line where a call does not fit): 400 before


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _layer(module: str) -> int:
    best = None
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (i, len(prefix))
    assert best is not None, f"{module} is in no layer of tests/test_layout.py: place it"
    return best[0]


def _imports(path: Path, module: str) -> set[str]:
    """Every module `module` imports anywhere in its source, `from zoo import x` as zoo.x."""
    tree = ast.parse(path.read_text())
    skipped = set()
    for node in ast.walk(tree):  # `if TYPE_CHECKING:` blocks
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            skipped |= {id(n) for n in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{module}: zoo uses absolute imports only"
            base = node.module
            submodules = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in _modules()}
            found |= submodules if base == "zoo" and submodules else {base} | submodules
    return found


def test_no_module_is_over_the_size_limit():
    sizes = {m: len(p.read_text().splitlines()) for m, p in _modules().items()}
    assert {m: n for m, n in sizes.items() if n > MAX_LINES} == {}


def test_imports_point_down_the_data_flow():
    modules = _modules()
    wrong = []
    for module, path in modules.items():
        for imported in _imports(path, module):  # `import zoo` is the public API: the top layer
            if imported == "zoo" or imported.startswith("zoo."):
                target = max((m for m in modules if imported == m or imported.startswith(m + ".")), key=len)
                if _layer(target) > _layer(module):
                    wrong.append(f"{module} imports {target}")
    assert wrong == []


def _import_graph() -> dict[str, set[str]]:
    """Each module -> the zoo modules it imports anywhere (a function's lazy imports too)."""
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        targets = {
            max((m for m in modules if i == m or i.startswith(m + ".")), key=len)
            for i in _imports(path, module)
            if i == "zoo" or i.startswith("zoo.")
        }
        graph[module] = targets - {module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module: each is an import cycle."""
    reach = {m: set() for m in graph}
    for start in graph:
        todo = list(graph[start])
        while todo:
            m = todo.pop()
            if m not in reach[start]:
                reach[start].add(m)
                todo.extend(graph[m])
    found = []
    for m in graph:
        component = {m} | {n for n in reach[m] if m in reach[n]}
        if len(component) > 1 and component not in found:
            found.append(component)
    return found


def test_the_load_layer_sits_below_the_api_and_never_imports_it():
    """zoo.load binds .materialize and the lazy load, which once opened the registry through zoo.api from inside
    a call: a cycle. The api builds on the load layer; the load layer reads rows through zoo.registry."""
    assert _layer("zoo.state") < _layer("zoo.load") < _layer("zoo.api")
    for module in ("zoo.load", "zoo.state"):
        imported = _imports(_modules()[module], module)
        assert not {i for i in imported if i == "zoo" or i == "zoo.api" or i.startswith("zoo.api.")}, module


def test_no_import_cycle():
    """Anywhere in the package (lazy imports inside functions count): api and load, the weights readers and the
    DCP reader (zoo.weights.opening picks between them), the analysis package and its kernel cache."""
    assert _cycles(_import_graph()) == []


def test_the_grammar_imports_neither_the_registry_nor_sqlalchemy_nor_torch():
    imported = _imports(PACKAGE / "query.py", "zoo.query")
    assert not {i for i in imported if i.split(".")[0] in ("sqlalchemy", "torch") or i.startswith("zoo.registry")}


@pytest.mark.parametrize("module", sorted(m for m in _modules() if "." in m))
def test_no_submodule_is_shadowed_by_an_attribute_of_its_package(module):
    parent, leaf = module.rsplit(".", 1)
    loaded = importlib.import_module(module)
    assert getattr(importlib.import_module(parent), leaf) is loaded


def test_every_exception_lives_in_zoo_errors_and_is_exported():
    defined_elsewhere = []
    for module, path in _modules().items():
        if module == "zoo.errors":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ClassDef)
                and node.name.startswith("_")
                and [getattr(b, "id", None) for b in node.bases] == ["BaseException"]
            ):
                continue  # a private signal that unwinds a call and is caught in its module (zoo.construction)
            if isinstance(node, ast.ClassDef) and any(
                getattr(b, "id", getattr(b, "attr", "")).endswith(("Error", "Exception", "Timeout")) for b in node.bases
            ):
                defined_elsewhere.append(f"{module}.{node.name}")
    assert defined_elsewhere == []
    classes = [
        c
        for _, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, BaseException) and c.__module__ == "zoo.errors"
    ]
    assert {c.__name__ for c in classes} <= set(zoo.__all__)
    assert all(issubclass(c, errors.ZooError) for c in classes)
    # each also subclasses a built-in exception other than Exception itself, so `except KeyError` etc. work
    assert all(
        any(b.__module__ == "builtins" and b is not Exception for b in c.__mro__[1:])
        for c in classes
        if c is not errors.ZooError
    )


def test_one_module_compiles_the_search_tree_to_sql():
    """zoo.registry.where is the only walker of the grammar's tree (Compare, And, Or, Not) outside zoo.query:
    the SQLAlchemy store and the sqlite3 reader both run its SQL, so they cannot drift apart."""
    nodes = {"Compare", "And", "Or", "Not"}
    walkers = []
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "zoo.query" and nodes & {a.name for a in node.names}:
                walkers.append(module)
    assert walkers == ["zoo.registry.where"]


@pytest.mark.parametrize("name", ["timm", "torchvision", "hf", "user", "checkpoint", "toy"])
def test_every_family_implements_the_protocol_with_its_signatures(name):
    """zoo.families.base.Family, names and signatures (a family module is checked as a class would be); "toy" is
    tests/toy_family.py, the one-file family of tests/test_family_protocol.py."""
    from zoo.families import FAMILIES, WithDefaults, family
    from zoo.families.base import Family

    fam = family(name) if name in FAMILIES else WithDefaults(importlib.import_module("tests.toy_family"))
    assert isinstance(fam, Family)
    assert [a for a in Family.__annotations__ if not hasattr(fam, a)] == []
    for hook, declared in vars(Family).items():
        if inspect.isfunction(declared) and not hook.startswith("_"):
            want = list(inspect.signature(declared).parameters)[1:]  # less self
            assert list(inspect.signature(getattr(fam, hook)).parameters) == want, hook


def test_no_module_outside_the_families_branches_on_a_family_name():
    """What differs by family is the family's to say (zoo.families.base): a comparison of a model's family, or a
    family name, with a literal family name (`recipe.family == "timm"`) anywhere else is a seam leaking."""
    from zoo.families import FAMILIES

    def family_valued(node) -> bool:
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
        return name in ("family", "family_name")

    leaks = []
    for module, path in _modules().items():
        if module.startswith("zoo.families"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(family_valued(n) for n in [node.left, *node.comparators]):
                values = [
                    e
                    for n in [node.left, *node.comparators]
                    for e in (n.elts if isinstance(n, (ast.Tuple, ast.List, ast.Set)) else [n])
                ]
                if any(isinstance(v, ast.Constant) and v.value in FAMILIES for v in values):
                    leaks.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    assert leaks == []


def test_only_zoo_constants_reads_zoos_environment_variables():
    """constants.py says it holds every variable zoo reads; kernel_cache.py read ZOO_KERNEL_CACHE itself."""
    readers = []
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith("ZOO_")
                and node.value.isupper()
                and module != "zoo.constants"
            ):
                readers.append(f"{module}: {node.value}")
    source = {m: p.read_text() for m, p in _modules().items()}
    assert [r for r in readers if "environ" in source[r.split(":")[0]] or "getenv" in source[r.split(":")[0]]] == []


def test_the_readme_layout_names_every_module():
    """ARCHITECTURE.md's layout block (the README's, before the README moved its detail into docs/) is where a new
    engineer starts: it missed 11 modules. Each module's name (or its file) must appear in the block; a package's
    modules may be named on its line."""
    architecture = (PACKAGE.parent / "ARCHITECTURE.md").read_text()
    block = architecture.split("## Layout", 1)[1].split("```", 2)[1]
    missing = [m for m in _modules() if m != "zoo" and not re.search(rf"\b{re.escape(m.rsplit('.', 1)[1])}\b", block)]
    assert missing == [], f"name these modules in ARCHITECTURE.md's layout block: {missing}"


def test_model_info_declares_the_public_columns_as_generated():
    """ModelInfo's fields and the models table's attributes are written out (editors and type checkers see them),
    from zoo.columns by tools/gen_model_info.py: a column added without running it fails here."""
    import runpy

    tool = runpy.run_path(str(PACKAGE.parent / "tools" / "gen_model_info.py"))
    text = (PACKAGE / "model_info.py").read_text()
    assert tool["generated"](text) == text, "run python tools/gen_model_info.py"
    tables = (PACKAGE / "registry" / "tables.py").read_text()
    assert tool["generated_tables"](tables) == tables, "run python tools/gen_model_info.py"
    from zoo.columns import PUBLIC
    from zoo.model_info import ModelInfo

    assert list(ModelInfo.__dataclass_fields__)[: len(PUBLIC)] == [c.name for c in PUBLIC]


_EMPTY_CONTAINERS = ("dict", "set", "list", "OrderedDict", "defaultdict")


def _module_level_caches(tree: ast.Module) -> set[str]:
    """Names bound at module level to an empty dict, set or list (filled as the process runs), and names a
    function rebinds with `global` (a lazily set value)."""
    names = set()
    for node in tree.body:
        target, value = (
            (node.targets[0], node.value)
            if isinstance(node, ast.Assign)
            else (node.target, node.value)
            if isinstance(node, ast.AnnAssign)
            else (None, None)
        )
        empty = (
            isinstance(value, (ast.Dict, ast.Set, ast.List))
            and not getattr(value, "keys", getattr(value, "elts", None))
            or isinstance(value, ast.Call)
            and getattr(value.func, "id", getattr(value.func, "attr", None)) in _EMPTY_CONTAINERS
            and not value.args
        )
        if isinstance(target, ast.Name) and empty:
            names.add(target.id)
    names |= {n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names}
    return names


# Module-level containers that are no caches, with the reason.
NOT_CACHES = {
    "zoo.registry.db._inherited": "a forked child's references to its parent's connections: released, they would "
    "be closed there, and closing a PostgreSQL connection ends the parent's session",
}


def test_every_module_level_cache_is_registered_with_a_bound():
    """One registry of caches (zoo.caching) with one reset, zoo.cache_clear(): about ten caches each had their own
    lifetime and some no bound. A module that keeps one names it in a register(...) call."""
    unregistered = []
    for module, path in _modules().items():
        if module == "zoo.caching":
            continue
        tree = ast.parse(path.read_text())
        registered = {
            ast.unparse(arg)
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "register"
            for arg in [*node.args, *(k.value for k in node.keywords)]
        }
        text = " ".join(registered)
        unregistered += [
            f"{module}.{name}"
            for name in _module_level_caches(tree)
            if not re.search(rf"\b{name}\b", text) and f"{module}.{name}" not in NOT_CACHES
        ]
    assert unregistered == []


def test_cache_clear_empties_every_cache():
    import zoo
    from zoo.caching import _ALL

    zoo.get("timm/resnet18")  # a template, structure parts, tags, engines or the lite reader
    assert zoo.caches()["templates"][0] >= 1
    assert all(0 < c.bound for c in _ALL.values())
    zoo.cache_clear()
    assert {name: size for name, (size, _) in zoo.caches().items() if size} == {}
    assert zoo.get("timm/resnet18") is not None  # and everything rebuilds after


def _public_api() -> dict[str, object]:
    """zoo's public functions and every public method of Zoo, by name."""
    import zoo
    from zoo.api import Zoo

    functions = {n: getattr(zoo, n) for n in zoo.__all__ if inspect.isfunction(getattr(zoo, n))}
    methods = {f"Zoo.{n}": f for n, f in vars(Zoo).items() if inspect.isfunction(f) and not n.startswith("_")}
    for base in Zoo.__mro__[1:-1]:  # Sizing, Recording
        methods |= {f"Zoo.{n}": f for n, f in vars(base).items() if inspect.isfunction(f) and not n.startswith("_")}
    return functions | methods


def test_every_public_function_and_method_documents_its_arguments_result_and_errors():
    """The API reference (docs/reference/python.md, from docstrings) says of each: Args (when it takes any),
    Returns and Raises, in the Google style mkdocstrings renders."""
    api = _public_api()
    assert {"get", "search", "estimate", "Zoo.get", "Zoo.index_family", "Zoo.add_weights"} <= set(api)
    undocumented = []
    for name, function in api.items():
        doc = inspect.getdoc(function) or ""
        takes = [p for p in inspect.signature(function).parameters if p != "self"]
        sections = ["Returns:"] + ([] if "raises nothing" in doc else ["Raises:"]) + (["Args:"] if takes else [])
        undocumented += [f"{name}: {s}" for s in sections if f"\n{s}\n" not in f"\n{doc}\n"]
        undocumented += [f"{name}: {p}" for p in takes if not re.search(rf"^    \**{p}:", doc, re.MULTILINE)]
    assert undocumented == []


def test_every_noqa_says_why():
    """A lint rule switched off on a line says why on that line (`# noqa: E402 - after ...`)."""
    marker = "# " + "noqa"  # not spelled out here: this file would match itself
    bare = [
        f"{path.relative_to(PACKAGE.parent)}:{number}"
        for folder in ("zoo", "tests", "bench", "tools", "docs")
        for path in (PACKAGE.parent / folder).rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if marker in line and not re.search(marker + r"(: [A-Z0-9, ]+)? - \S", line)
    ]
    assert bare == []
