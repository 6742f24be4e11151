"""Imports between tqstore's layers point one way (docs: DESIGN.md §1, "The parts").

Every module under ``tqstore/`` is parsed with :mod:`ast` (nothing is imported): every
``import`` and ``from ... import``, relative or absolute, at module level or inside a
function, counts.  Layers, and what each may import besides its own layer:

=============  ============================================================  ==========================
layer          modules                                                        may import
=============  ============================================================  ==========================
base           ``errors``, ``_version``, ``_interrupts``                      nothing of tqstore
native         ``_native/*`` (record hot path, C or pure Python)              base
format         ``_format/*`` (bytes in, objects out; never opens a file)      native, base
io             ``_io/*`` (every syscall, LMDB envs, failpoints)               format, native, base
ports          ``ports`` (the UnitPort and ControllerPort interfaces and       format, native, base
               the values that cross them)
policies       ``samplers``, ``seqlen_sampler`` (pure sampling policies:       base
               the controller runs them, users choose them)
engine-impl    ``unit``, ``unit_*``, ``controller``, ``controller_*``      policies, ports, io,
               (the implementations of                                         format, native, base
               the ports, their checkpoint export and import and the
               dump's shard and row metadata included)
embedded       ``embedded`` (the embedded backend's entry: constructs the      engine-impl, policies,
               parts, reads their files of a checkpoint into values)           ports, io, format,
                                                                              native, base
engine         ``store``, ``state_switch``, ``kv``, ``streaming``, ``call_checks``, ``reader``,  embedded, policies,
               ``store_open``, ``store_undo``, ``store_check``, ``store_lock``, ports, io (not
               ``running_loads``,
               ``meta``, ``meta_schema``, ``edge``, ``policy``, ``layout_dirs``,
               ``_gcpause``, ``_gilswitch``, ``_default``, ``capacity``,      ``_io.lmdbenv`` nor
               ``checkpoint/*``,
               ``dump/*`` (the engine over the ports; numpy and bytes, no     ``_io.segfile``), format,
               framework)                                                     native, base
ray            ``ray/*`` (units and controller as actors, same ports)          engine, embedded,
                                                                              engine-impl, policies,
                                                                              ports, io, format,
                                                                              native, base
edge           ``torch_adapter`` (torch, nested tensors and TensorDict         engine, policies, ports,
               to and from the engine's Columns, allocator and results)       format, base
api            ``__init__``, ``api``, ``client``, ``cli``, ``cli_*``,         edge, ray, engine,
               ``__main__``,
               ``async_api``, ``_executor``, ``fetch_wait``, ``config``,       policies, ports, base
               ``metrics``, ``dataloader``, ``metadata``, ``sampler`` (TQ's
               API edge; the last two are its module names)
testing        ``testing/*`` (crash and power-loss harnesses, conformance)     anything
=============  ============================================================  ==========================

Nothing outside ``testing`` imports ``testing``.  A module in no layer fails the test:
a new module is placed in the table on purpose.

Native is the bottom of the record path: ``_format`` uses its CRC32C and framing
functions, so ``_native`` imports nothing from ``_format``.  The byte layout both need
(frame and segment constants) is defined in ``_native/layout.py``; ``_format/layout.py``
re-exports it for the format layer and everything above.

Checks: (a) no import outside what the importer's layer may import; (b) no cycle in
the import graph between modules, between packages (a subpackage such as ``checkpoint``
is one node, a top-level module is a node) or between layers; (c) only ``_io``, ``unit``,
``unit_read``, ``unit_recover``, ``unit_export``, ``unit_import``, ``unit_restore``, ``controller`` and
``controller_export`` import ``lmdb``; (d) only ``torch_adapter`` and ``dataloader`` (a torch ``IterableDataset``)
import ``torch`` or ``tensordict``: the engine and the format work on numpy arrays and bytes
(DESIGN.md §1).

``KNOWN_VIOLATIONS`` lists today's breaches as ``(importer, imported)``; the test fails
on any breach not in it, and on any entry that no longer occurs, so it only shrinks.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

PKG = Path(__file__).resolve().parents[1] / "tqstore"

# (layer, module-name prefixes, without the leading "tqstore.")
LAYERS: List[Tuple[str, Tuple[str, ...]]] = [
    ("base", ("errors", "_version", "_interrupts")),
    ("native", ("_native",)),
    ("format", ("_format",)),
    ("io", ("_io",)),
    ("ports", ("ports", "ports_restore", "ports_transfer", "port_calls")),
    ("policies", ("samplers", "seqlen_sampler")),
    ("engine-impl", ("unit", "unit_read", "unit_recover", "unit_export", "unit_import", "unit_dump", "unit_restore",
                     "unit_locs", "unit_compact", "unit_held", "unit_gate", "unit_snapshots",
                     "controller", "controller_mirror", "controller_put", "controller_decode", "controller_sampling", "controller_persist",
                     "controller_export", "controller_dump", "controller_restore", "controller_snapshots",
                     "controller_consumption", "controller_sampler_store")),
    ("embedded", ("embedded",)),
    ("engine", ("store", "store_open", "store_lock", "store_snapshot", "store_undo", "store_check", "store_verify", "state_switch", "kv", "streaming", "call_checks", "reader", "read_guard", "meta", "meta_kv",
                "meta_schema", "edge", "policy", "layout_dirs", "running_loads",
                "capacity", "_gcpause", "_gilswitch", "_default", "checkpoint", "dump")),
    ("ray", ("ray",)),
    ("edge", ("torch_adapter",)),
    ("api", ("", "api", "client", "cli", "cli_util", "cli_inspect", "cli_dumps", "cli_admin", "cli_demo", "cli_demo_loop",
             "__main__", "async_api", "_executor", "fetch_wait", "config", "metrics",
             "dataloader", "metadata", "sampler")),  # "" is tqstore/__init__.py
    ("testing", ("testing",)),
]
ALLOWED: Dict[str, Set[str]] = {
    "base": set(),
    "native": {"base"},
    "format": {"native", "base"},
    "io": {"format", "native", "base"},
    "ports": {"format", "native", "base"},
    "policies": {"base"},
    "engine-impl": {"policies", "ports", "io", "format", "native", "base"},
    "embedded": {"engine-impl", "policies", "ports", "io", "format", "native", "base"},
    "engine": {"embedded", "policies", "ports", "io", "format", "native", "base"},
    "ray": {"engine", "embedded", "engine-impl", "policies", "ports", "io", "format", "native", "base"},
    "edge": {"engine", "policies", "ports", "format", "base"},
    "api": {"edge", "ray", "engine", "policies", "ports", "base"},
    "testing": {name for name, _ in LAYERS},
}
# io modules the engine over the ports must not reach: LMDB environments and segment files
ENGINE_FORBIDDEN_IO = {"tqstore._io.lmdbenv", "tqstore._io.segfile"}
LMDB_ALLOWED = ("_io", "unit", "unit_read", "unit_recover", "unit_export", "unit_import", "unit_restore", "controller",
                "controller_export")
# the one adapter that knows torch and TensorDict, and the torch IterableDataset over the data plane
FRAMEWORK_ALLOWED = ("torch_adapter", "dataloader")
FRAMEWORKS = ("torch", "tensordict")

# Today's breaches of the layers (issue #9 emptied it: the engine reaches the units and the
# controller through the ports, and constructs them through ``embedded``).  Add none.
KNOWN_VIOLATIONS: Set[Tuple[str, str]] = set()


# ------------------------------------------------------------------ the import graph
def _modules() -> Dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _package_of(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]


def _resolve(base: str, name: Optional[str]) -> str:
    """``base.name`` when that is a module of tqstore, else ``base``."""
    if name and f"{base}.{name}" in MODULES:
        return f"{base}.{name}"
    return base


def _type_checking_only(tree: ast.AST) -> Set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks (never executed)."""
    out: Set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def imports_of(module: str, *, runtime_only: bool = False) -> Iterator[Tuple[str, int]]:
    """``(imported module, line)`` for every import in ``module``, function-local ones included;
    ``runtime_only`` leaves out imports for type checkers only (``if TYPE_CHECKING:``), which
    obey the layers like any other but cannot form a cycle at run time."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    skip = _type_checking_only(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(module)
                for _ in range(node.level - 1):
                    base = base.rsplit(".", 1)[0]
                if node.module:
                    base = f"{base}.{node.module}"
            else:
                base = node.module or ""
            for alias in node.names:
                yield _resolve(base, alias.name), node.lineno


def layer_of(module: str) -> Optional[str]:
    rest = module[len("tqstore."):] if module.startswith("tqstore.") else ("" if module == "tqstore" else None)
    if rest is None:
        return None
    for name, prefixes in LAYERS:
        for p in prefixes:
            if rest == p or (p and rest.startswith(p + ".")):
                return name
    return None


def _internal(target: str) -> bool:
    return target == "tqstore" or target.startswith("tqstore.")


def _node(module: str) -> str:
    """A subpackage of tqstore is one node of the package graph; a top-level module is its own."""
    parts = module.split(".")
    if len(parts) >= 2 and f"tqstore.{parts[1]}" in MODULES and MODULES[f"tqstore.{parts[1]}"].name == "__init__.py":
        return f"tqstore.{parts[1]}"
    return ".".join(parts[:2])


def find_violations() -> Dict[Tuple[str, str], str]:
    """Every breach of (a) and (c): ``(importer, imported)`` → a readable reason."""
    found: Dict[Tuple[str, str], str] = {}
    for module in MODULES:
        src = layer_of(module)
        for target, line in imports_of(module):
            where = f"{MODULES[module].relative_to(PKG.parent)}:{line}"
            if target.split(".")[0] in FRAMEWORKS:
                if not any(module == f"tqstore.{p}" for p in FRAMEWORK_ALLOWED):
                    found[(module, target.split(".")[0])] = (f"{where}: imports {target} (only "
                                                             f"{', '.join(FRAMEWORK_ALLOWED)} may)")
                continue
            if target.split(".")[0] == "lmdb":
                if not any(module == f"tqstore.{p}" or module.startswith(f"tqstore.{p}.") for p in LMDB_ALLOWED):
                    found[(module, "lmdb")] = f"{where}: imports lmdb (only {', '.join(LMDB_ALLOWED)} may)"
                continue
            if not _internal(target):
                continue
            dst = layer_of(target)
            if src is None or dst is None or src == dst:
                continue
            if dst not in ALLOWED[src]:
                found[(module, target)] = f"{where}: {src} layer imports {target} ({dst} layer)"
            elif src == "engine" and target in ENGINE_FORBIDDEN_IO:
                found[(module, target)] = f"{where}: the engine over the ports imports {target}"
    return found


def _cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    out: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _graph(key, *, skip_known: bool) -> Dict[str, Set[str]]:
    edges: Dict[str, Set[str]] = defaultdict(set)
    for module in MODULES:
        for target, _ in imports_of(module, runtime_only=True):
            if not _internal(target) or (skip_known and (module, target) in KNOWN_VIOLATIONS):
                continue
            a, b = key(module), key(target)
            if a is not None and b is not None and a != b:
                edges[a].add(b)
    return edges


# ------------------------------------------------------------------ the tests
def test_every_module_is_in_a_layer():
    lost = sorted(m for m in MODULES if layer_of(m) is None)
    assert not lost, f"modules in no layer (place them in LAYERS and the docstring's table): {lost}"


def test_imports_point_down_the_layers_and_only_the_engine_impl_and_io_import_lmdb_and_only_the_adapter_torch():
    found = find_violations()
    new = sorted(reason for pair, reason in found.items() if pair not in KNOWN_VIOLATIONS)
    assert not new, "imports against the layers of DESIGN.md §1:\n  " + "\n  ".join(new)


def test_known_violations_only_shrink():
    gone = sorted(KNOWN_VIOLATIONS - find_violations().keys())
    assert not gone, f"these KNOWN_VIOLATIONS no longer occur: delete them from tests/test_layers.py: {gone}"


def _module(name: str) -> Optional[str]:
    return name if name in MODULES else None


@pytest.mark.parametrize("graph", ["modules", "packages", "layers"])
def test_no_import_cycles(graph):
    # the known violations are reported above; a cycle made of allowed imports is a new problem
    key = {"modules": _module, "packages": _node, "layers": layer_of}[graph]
    cycles = _cycles(_graph(key, skip_known=True))
    assert not cycles, f"import cycles between {graph}: {cycles}"


def test_the_checker_sees_relative_local_and_aliased_imports():
    got = dict(imports_of("tqstore.checkpoint.loader"))
    assert "tqstore.checkpoint.writer" in got  # function-local (from .writer import settle)
    assert "tqstore._io.files" in got  # from .._io import files: the submodule, two dots
    assert "tqstore.unit_export" in dict(imports_of("tqstore.unit"))  # function-local, one dot
    assert "lmdb" in dict(imports_of("tqstore.unit_export"))
    assert layer_of("tqstore") == "api" and layer_of("tqstore.unit_read") == "engine-impl"
    assert layer_of("tqstore.checkpoint.writer") == "engine" and layer_of("tqstore.units") is None
    assert layer_of("tqstore.unit_export") == "engine-impl" and layer_of("tqstore.embedded") == "embedded"
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert dict(imports_of("tqstore.torch_adapter")).keys() >= {"torch", "tqstore.edge"}
    assert layer_of("tqstore.torch_adapter") == "edge"


def test_the_engine_runs_without_torch():
    """The engine below the adapter, with the framework-free edge: numpy in, numpy and lists out."""
    import subprocess
    import sys
    code = (
        "import sys, builtins, numpy as np\n"
        "real = builtins.__import__\n"
        "def guard(name, *a, **k):\n"
        "    if name.split('.')[0] in ('torch', 'tensordict'): raise ImportError('no ' + name)\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = guard\n"
        "sys.modules['tqstore'] = type(sys)('tqstore'); sys.modules['tqstore'].__path__ = [sys.argv[1]]\n"
        "from tqstore.store import Store\n"
        "from tqstore.edge import NumpyEdge\n"
        "with Store(None, edge=NumpyEdge()) as s:\n"
        "    s.kv_batch_put(['a', 'b'], 'p', {'x': np.arange(6).reshape(2, 3), 'j': [np.ones(2), np.ones(3)],\n"
        "                   't': ['u', b'v']})\n"
        "    out = s.kv_batch_get(['a', 'b'], 'p')\n"
        "    assert (out['x'] == np.arange(6).reshape(2, 3)).all() and out['t'] == ['u', b'v']\n"
        "    assert [len(r) for r in out['j']] == [2, 3]\n"
        "    g, c = s.get_consumption_status('t', 'p'); assert isinstance(c, np.ndarray)\n"
        "    m = s.get_meta(['x', 'j'], None, 'p', mode='force_fetch')\n"
        "    assert m.field_schema['x']['shape'] == (3,) and m.field_schema['j']['is_nested'] is True\n"
        "assert 'torch' not in sys.modules\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(PKG)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
