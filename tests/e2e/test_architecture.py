"""The import graph keeps the architecture of docs/architecture.md: no cycles, no private names
across packages, `algo/` pure (torch only), `config/` importing nothing else of rlvr, and every
import pointing down the layers (a step flows down the tree and never back up)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from _paths import REPO, TESTS

SRC = REPO / "src" / "rlvr"

# Lower layers never import higher ones; a package may import its own modules and any lower layer.
LAYERS = [
    {"config", "algo", "dist", "hub", "specs", "live", "sandbox", "data"},
    {"models", "rewards", "observe", "tools", "tasks"},
    {"rollout"},
    {"training", "serve"},
    {"cli", "__main__", "api", "rlvr"},  # `rlvr` itself: the public names (rlvr.train, rlvr.GRPOTrainer) come from api
]


def _module_name(path: Path) -> str:
    parts = ("rlvr", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1]) if parts[-1] == "__init__" else ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in SRC.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> list[tuple[str, list[str], int]]:
    """(imported module, names imported from it, line) for every import in the file, at any depth
    (a lazy import inside a function is still a dependency)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [a.name for a in node.names]
            # `from rlvr.rollout import episodes` imports the module rlvr.rollout.episodes
            subs = [f"{base}.{n}" for n in names if f"{base}.{n}" in known]
            out += [(s, [], node.lineno) for s in subs] or [(base, names, node.lineno)]
    return out


def _graph() -> tuple[dict[str, set[str]], list[tuple[str, str, list[str], int]]]:
    mods = _modules()
    known = set(mods)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    edges = []
    for name, path in mods.items():
        for target, names, line in _imports(name, path, known):
            edges.append((name, target, names, line))
            if target in known and target != name:
                graph[name].add(target)
    return graph, edges


def _package(module: str) -> str:
    return module.split(".")[1] if module.count(".") else module


def _layer(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def test_every_package_has_a_layer_and_a_docstring():
    for name, path in _modules().items():
        _layer(_package(name))  # StopIteration: a new package that LAYERS does not place
        if path.read_text().strip():
            assert ast.get_docstring(ast.parse(path.read_text())), f"{name} has no docstring saying what it is for"


def test_no_import_cycles():
    graph, _ = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycle = stack[stack.index(n) :] + [n]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_no_private_names_across_packages():
    bad = []
    for src, target, names, line in _graph()[1]:
        if not target.startswith("rlvr") or _package(src) == _package(target):
            continue
        private = [n for n in names if n.startswith("_")] + [p for p in target.split(".") if p.startswith("_") and p != "__init__"]
        if private:
            bad.append(f"{src}:{line} imports {private} from {target}")
    assert not bad, "\n".join(bad)


def test_algo_imports_only_torch_and_the_standard_library():
    bad = [
        f"{s}:{line} imports {t}"
        for s, t, _, line in _graph()[1]
        if _package(s) == "algo"
        and t.split(".")[0] not in {"torch", "__future__", "typing", "dataclasses", "math", "collections"}
        and not t.startswith("rlvr.algo")
    ]
    assert not bad, "\n".join(bad)


def test_config_imports_nothing_else_of_rlvr():
    bad = [
        f"{s}:{line} imports {t}"
        for s, t, _, line in _graph()[1]
        if _package(s) == "config" and t.startswith("rlvr") and not t.startswith("rlvr.config")
    ]
    assert not bad, "\n".join(bad)


def test_imports_point_down_the_layers():
    bad = []
    for src, target, _, line in _graph()[1]:
        if target.startswith("rlvr.") and _layer(_package(target)) > _layer(_package(src)):
            bad.append(f"{src}:{line} imports {target} (layer {_layer(_package(target))} above {_layer(_package(src))})")
    assert not bad, "\n".join(bad)


def _torch_distributed_uses(path: Path) -> list[int]:
    """Lines that import or reach torch.distributed (or DDP, torch.nn.parallel)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
            names = [f"torch.{node.attr}"]
        else:
            continue
        if any(n.startswith(("torch.distributed", "torch.nn.parallel")) for n in names):
            lines.append(node.lineno)
    return lines


def test_only_dist_touches_torch_distributed():
    bad = [f"{name}:{line}" for name, path in _modules().items() if _package(name) != "dist" for line in _torch_distributed_uses(path)]
    assert not bad, "torch.distributed outside rlvr/dist/: " + ", ".join(bad)
    assert _torch_distributed_uses(SRC / "dist" / "parallel.py")  # the check sees DDP / fully_shard where they are


def test_every_built_in_task_is_one_registered_module():
    """tasks/ holds one module (or one package, for a large task) per task, each in TASKS with its make_task (and
    task.py, what they build)."""
    from rlvr.tasks import TASKS

    tasks = SRC / "tasks"
    modules = {p.stem for p in tasks.glob("*.py")} - {"__init__", "task"}
    modules |= {p.parent.name for p in tasks.glob("*/__init__.py")}
    assert modules == {m.__name__.rsplit(".", 1)[1] for m in TASKS.values()}
    assert all(callable(getattr(m, "make_task", None)) for m in TASKS.values())


def test_the_checks_see_a_cycle_and_a_private_import(tmp_path, monkeypatch):
    """The checks above can fail: a two-module cycle and a private cross-package import are found."""
    pkg = tmp_path / "rlvr"
    (pkg / "algo").mkdir(parents=True)
    (pkg / "training").mkdir()
    (pkg / "algo" / "a.py").write_text('"""a"""\nfrom rlvr.training.b import x\n')
    (pkg / "training" / "b.py").write_text('"""b"""\nfrom rlvr.algo.a import _y\n')
    monkeypatch.setattr(sys.modules[__name__], "SRC", pkg)
    graph, edges = _graph()
    assert "rlvr.training.b" in graph["rlvr.algo.a"] and "rlvr.algo.a" in graph["rlvr.training.b"]
    with pytest.raises(pytest.fail.Exception, match="import cycle"):
        test_no_import_cycles()
    with pytest.raises(AssertionError, match="_y"):
        test_no_private_names_across_packages()
    with pytest.raises(AssertionError, match="layer"):
        test_imports_point_down_the_layers()


ROLLOUT = SRC / "rollout"


def _stray_rollout_modules(rollout: Path) -> list[str]:
    """Modules of rollout/ that are neither a source nor an engine part (episodes.py, the seam, and the package inits may be)."""
    allowed = {Path("episodes.py"), Path("__init__.py")}
    return sorted(
        str(p.relative_to(rollout))
        for p in rollout.rglob("*.py")
        if p.relative_to(rollout).parts[0] not in ("sources", "engines") and p.relative_to(rollout) not in allowed
    )


def _engine_capability_probes(root: Path) -> list[str]:
    """hasattr(<something engine>, ...) calls: a capability found by probing instead of a declared Protocol."""
    bad = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "hasattr"
                and node.args
                and "engine" in ast.unparse(node.args[0]).lower()
            ):
                bad.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(node)}")
    return bad


def _long_functions(root: Path, limit: int) -> list[str]:
    out = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit:
                out.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    return out


def _long_files(root: Path, limit: int) -> list[str]:
    return [f"{p.relative_to(root)} ({n} lines)" for p in root.rglob("*.py") if (n := len(p.read_text().splitlines())) > limit]


def test_rollout_is_sources_and_engines():
    """rollout/ holds the Episodes seam, sources/ and engines/: nothing else."""
    assert (ROLLOUT / "sources" / "__init__.py").is_file() and (ROLLOUT / "engines" / "hf" / "__init__.py").is_file()
    assert not _stray_rollout_modules(ROLLOUT), _stray_rollout_modules(ROLLOUT)


def test_no_engine_capability_is_found_by_hasattr():
    """What an engine can do is a declared Protocol (rlvr.rollout.engines.protocols), checked with isinstance."""
    assert not _engine_capability_probes(SRC), "\n".join(_engine_capability_probes(SRC))


def _untrue_file_lists(package: Path) -> list[str]:
    """What the __init__ docstrings of `package` and its subpackages get wrong: a module or subpackage they
    do not name, or a `name.py` they name that is not there."""
    out = []
    for init in sorted(package.rglob("__init__.py")):
        here, doc = init.parent, ast.get_docstring(ast.parse(init.read_text())) or ""
        children = [p.name for p in here.glob("*.py") if p.name != "__init__.py"]
        children += [f"{p.name}/" for p in here.iterdir() if (p / "__init__.py").is_file()]
        out += [
            f"{here.relative_to(package.parent)}: {c} not listed" for c in sorted(children) if not re.search(rf"(^|\s){re.escape(c)}", doc)
        ]
        out += [
            f"{here.relative_to(package.parent)}: lists {m}, which is not there"
            for m in re.findall(r"[\w/]+\.py\b", doc)
            if not (here / m).is_file()
        ]
    return out


def test_rollout_package_docstrings_list_their_files():
    assert not _untrue_file_lists(ROLLOUT), "\n".join(_untrue_file_lists(ROLLOUT))


def test_rollout_functions_and_files_are_short():
    assert not _long_functions(ROLLOUT, 50), "functions over 50 lines:\n" + "\n".join(_long_functions(ROLLOUT, 50))
    assert not _long_files(ROLLOUT, 400), "files over 400 lines:\n" + "\n".join(_long_files(ROLLOUT, 400))


def test_the_rollout_checks_see_a_stray_module_a_probe_and_long_code(tmp_path):
    """The checks above can fail: a helper module loose in rollout/, hasattr on an engine, a 51-line function, a 401-line file."""
    (tmp_path / "sources").mkdir()
    (tmp_path / "episodes.py").write_text('"""e"""\n')
    (tmp_path / "sources" / "a.py").write_text('"""a"""\n')
    (tmp_path / "helpers.py").write_text('"""h"""\nif hasattr(self.engine, "generate_episodes"):\n    pass\n')
    (tmp_path / "long.py").write_text("def f():\n" + "    x = 1\n" * 50 + "\n" * 350)
    assert _stray_rollout_modules(tmp_path) == ["helpers.py", "long.py"]
    assert _engine_capability_probes(tmp_path) == ["helpers.py:2 hasattr(self.engine, 'generate_episodes')"]
    assert _long_functions(tmp_path, 50) == ["long.py:1 f (51 lines)"]
    assert _long_files(tmp_path, 400) == ["long.py (401 lines)"]
    (tmp_path / "__init__.py").write_text('"""episodes.py  the seam\n    gone.py  a file since removed"""\n')
    assert _untrue_file_lists(tmp_path) == [
        f"{tmp_path.name}: helpers.py not listed",
        f"{tmp_path.name}: long.py not listed",
        f"{tmp_path.name}: lists gone.py, which is not there",
    ]


def test_no_file_over_400_lines_but_the_doctors_rule_table():
    long = [f for f in _long_files(SRC, 400) if not f.startswith("observe/doctor.py ")]
    assert not long, "files over 400 lines:\n" + "\n".join(long)


def test_train_has_no_function_over_50_lines_and_no_file_over_400():
    """The loop and the update read in one sitting: small functions, small files."""
    assert not _long_functions(SRC / "training", 50), "functions over 50 lines:\n" + "\n".join(_long_functions(SRC / "training", 50))
    assert not _long_files(SRC / "training", 400), "files over 400 lines:\n" + "\n".join(_long_files(SRC / "training", 400))


def _issue_numbers(root: Path) -> list[str]:
    """Lines naming a tracker issue by number: they belong in commit messages and bench/results, not in code."""
    pattern = re.compile(r"\b" + "issue" + r"s? #?\d+", re.IGNORECASE)
    return [f"{p}:{i}" for p in sorted(root.rglob("*.py")) for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]


def test_no_issue_numbers_in_src_or_tests(tmp_path):
    tests = TESTS
    assert not _issue_numbers(SRC) + _issue_numbers(tests), _issue_numbers(SRC) + _issue_numbers(tests)
    (tmp_path / "a.py").write_text('"""As asked in Issue' + ' 12."""\n')
    assert _issue_numbers(tmp_path) == [f"{tmp_path / 'a.py'}:1"]
