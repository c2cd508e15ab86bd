"""Server error codes are named once, in flowwarden.mongo.codes, and compared by name everywhere else."""

from __future__ import annotations

import ast
from pathlib import Path

from flowwarden.mongo import codes
from flowwarden.mongo.failures import FATAL_CODES, TRANSIENT_CODES

SRC = Path(__file__).resolve().parents[2] / "src" / "flowwarden"
TABLE = SRC / "mongo" / "codes.py"


def _numbers(node: ast.AST, constants: dict[str, ast.AST]) -> list[int]:
    """The int literals ``node`` stands for: itself, the items of a set/tuple/list literal (also
    inside ``frozenset(...)``), or the value of a module constant it names."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return [node.value]
    if isinstance(node, (ast.Set, ast.Tuple, ast.List)):
        return [n for item in node.elts for n in _numbers(item, constants)]
    called = node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None
    if isinstance(node, ast.Call) and called in {"frozenset", "set"}:
        return [n for arg in node.args for n in _numbers(arg, constants)]
    if isinstance(node, ast.Name) and node.id in constants:
        return _numbers(constants[node.id], constants)
    return []


def _is_code(node: ast.AST) -> bool:
    """``x.code``, ``code``, ``x.get("code")`` or ``x["code"]``: an error's code."""
    if isinstance(node, ast.Attribute):
        return node.attr == "code"
    if isinstance(node, ast.Name):
        return node.id == "code"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "code"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "code"
    return False


def bare_codes(path: Path) -> list[str]:
    """Where ``path`` compares an error code with a number written in the module itself, or
    defines a ``..._CODES`` set of numbers."""
    shown = path.relative_to(SRC) if path.is_relative_to(SRC) else path.name
    tree = ast.parse(path.read_text(encoding="utf-8"))
    constants: dict[str, ast.AST] = {}
    for statement in tree.body:
        if isinstance(statement, ast.Assign):
            for target in statement.targets:
                if isinstance(target, ast.Name):
                    constants[target.id] = statement.value
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            if statement.value is not None:
                constants[statement.target.id] = statement.value
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_code(side) for side in sides):
                numbers = [n for side in sides if not _is_code(side) for n in _numbers(side, constants)]
                if numbers:
                    found.append(f"{shown}:{node.lineno} compares a code with {numbers}")
    for name, value in constants.items():
        if name.endswith("CODES") and _numbers(value, {}):
            found.append(f"{shown}: {name} lists bare numbers {_numbers(value, {})}")
    return found


def test_no_module_outside_the_table_compares_with_a_bare_code_number() -> None:
    modules = [path for path in sorted(SRC.rglob("*.py")) if path != TABLE]
    assert len(modules) > 50
    found = [line for path in modules for line in bare_codes(path)]
    assert not found, "name the code in flowwarden.mongo.codes instead:\n" + "\n".join(found)


def test_the_check_finds_each_way_of_writing_a_bare_code(tmp_path: Path) -> None:
    """The check above fails on the forms a bare code takes (so it is not passing by seeing none)."""
    planted = {
        "equal.py": "def f(error):\n    return error.code == 286\n",
        "reversed.py": "def f(error):\n    return 286 != error.code\n",
        "member.py": "def f(error):\n    return error.code in (13, 18)\n",
        "constant.py": "LOST = 286\n\ndef f(error):\n    return error.code == LOST\n",
        "frozen.py": "REFUSED = frozenset({13, 18})\n\ndef f(error):\n    return error.code in REFUSED\n",
        "reply.py": "def f(reply):\n    return reply.get('code') == 11000 or reply['code'] == 11000\n",
        "table.py": "RETRY_CODES = frozenset({6, 7})\n",
    }
    for name, text in planted.items():
        source = tmp_path / name
        source.write_text(text, encoding="utf-8")
        assert bare_codes(source), f"{name}: a bare code went unnoticed"
    named = tmp_path / "named.py"
    named.write_text(
        "from flowwarden.mongo import codes\n\nREFUSED = frozenset({codes.UNAUTHORIZED})\n\n"
        "def f(error):\n    return error.code == codes.CHANGE_STREAM_HISTORY_LOST or error.code in REFUSED\n",
        encoding="utf-8",
    )
    assert not bare_codes(named)


def test_every_classified_code_is_named_once() -> None:
    named = {value: name for name, value in vars(codes).items() if name.isupper() and type(value) is int}
    assert sorted(named.values()) == sorted(codes.__all__), "a code with two names, or a name not exported"
    assert (TRANSIENT_CODES | FATAL_CODES) <= set(named)
    assert codes.CHANGE_STREAM_HISTORY_LOST == 286
