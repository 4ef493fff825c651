"""The package's shape: one folder per concern, each saying in its __init__ what lives there (the
README's "Where things are" table is made from those lines), few flat modules, and imports
that never go round in a circle, between folders or between modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dlio_mpi"
MAX_FLAT_MODULES = 10  # besides __init__ and __main__
HEADING = "## Where things are"


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def _first_paragraph(path: Path) -> str:
    return _docstring(path).split("\n\n")[0]


def concerns() -> list[tuple[str, str]]:
    """(folder or flat module, what lives there: the first paragraph of its docstring)."""
    rows = [(f"`dlio_mpi/{p.parent.name}/`", _first_paragraph(p))
            for p in sorted(PACKAGE.glob("*/__init__.py"))]
    rows += [(f"`dlio_mpi/{p.name}`", _first_paragraph(p)) for p in sorted(PACKAGE.glob("*.py"))
             if p.name not in ("__init__.py", "__main__.py")]
    return rows


def where_things_are() -> str:
    """The README's table, as the docstrings say it."""
    lines = ["| where | what lives there |", "|---|---|"]
    lines += [f"| {name} | {' '.join(text.split())} |" for name, text in concerns()]
    return "\n".join(lines)


def test_each_folder_and_module_says_in_two_lines_what_lives_there():
    for name, text in concerns():
        assert text, f"{name} has no docstring"
        assert len(text.splitlines()) <= 2, f"{name}'s first paragraph: {text!r}"


def test_few_modules_sit_flat_in_the_package():
    flat = [p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert len(flat) <= MAX_FLAT_MODULES, sorted(flat)


def test_the_readme_table_is_the_docstrings():
    readme = (ROOT / "README.md").read_text()
    section = readme.split(HEADING, 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    assert table == where_things_are(), "README's table, as the docstrings say it:\n\n" + \
        where_things_are()


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(top_level_only: bool = False) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (inside functions too, unless
    top_level_only)."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        nodes = tree.body if top_level_only else list(ast.walk(tree))
        for node in nodes:
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    target = f"{source}.{alias.name}"
                    graph[module].add(target if target in modules else source)
            elif isinstance(node, ast.Import):
                graph[module].update(a.name for a in node.names)
        graph[module] = {t for t in graph[module] if t in modules and t != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def _folder(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else module


def test_no_import_goes_round_in_a_circle():
    assert cycles(import_graph()) == []
    folders: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        folders.setdefault(_folder(module), set()).update(
            _folder(t) for t in targets if _folder(t) != _folder(module))
    assert cycles(folders) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert re.fullmatch(r"dlio_mpi\.\w+", _folder("dlio_mpi.readers.native"))


# getattr/hasattr on a format, reader backend or checkpoint writer: a capability its protocol
# should declare (formats/base.py Format, readers/base.py ReaderBackend, checkpoint/writer.py)
PROBE = re.compile(r"\b(?:get|has)attr\(\s*(?:[\w.\[\]()]*\.)?"
                   r"(?:fmt|format|get_format\([^)]*\)|reader|writer|backend)\s*,")


def test_no_capability_is_probed_with_getattr():
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in sorted(PACKAGE.rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), start=1)
             if PROBE.search(line)]
    assert found == []
    assert PROBE.search('x = getattr(fmt, "sizes_recorded", False)')
    assert PROBE.search('getattr(get_format(cfg.dataset.format), "whole_file_only", False)')
    assert PROBE.search('hasattr(self.writer, "allocate")')


LONGEST = 80  # lines: a function fits on a screen


def long_python_functions() -> list[str]:
    found = []
    for path in sorted((ROOT / "dlio_mpi").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {lines}")
    return found


def c_function_lengths(text: str) -> dict[str, int]:
    """Top-level C function bodies (a line opening a definition at column 0, to the brace
    that closes it) and their lengths in lines, signature included."""
    lengths, lines = {}, text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(?:[A-Za-z_][\w \*]*?[ \*])?(\w+)\(", lines[i])
        if m and not lines[i].rstrip().endswith(";") and not lines[i].startswith(
                ("typedef", "static const", "#")):
            depth, j, opened = 0, i, False
            while j < len(lines):
                depth += lines[j].count("{") - lines[j].count("}")
                opened = opened or "{" in lines[j]
                if lines[j].rstrip().endswith(";") and not opened:
                    break  # a declaration over several lines
                if opened and depth == 0:
                    lengths[m.group(1)] = j - i + 1
                    break
                j += 1
            i = j + 1
        else:
            i += 1
    return lengths


def test_no_function_is_longer_than_a_screen():
    assert long_python_functions() == []
    long_c = [f"{path.name} {name} {n}" for path in sorted((ROOT / "csrc").glob("*.c"))
              for name, n in c_function_lengths(path.read_text()).items() if n > LONGEST]
    assert long_c == []


def test_the_c_function_measure_counts_a_body():
    text = "static int\nshort_one(int a)\n{\n    return a;\n}\nint f(void);\n" \
           "int g(int a,\n      int b)\n{\n" + "    a++;\n" * 90 + "}\n"
    assert c_function_lengths(text) == {"short_one": 4, "g": 94}
    assert len(c_function_lengths((ROOT / "csrc" / "dio_engine.c").read_text())) >= 5
