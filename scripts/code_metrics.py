"""The package's size and sprawl, as numbers a refactor can be judged by.

    python scripts/code_metrics.py [--package cl_zoo] [--json] [--list]

Reads every module with :mod:`ast` and :mod:`tokenize` (nothing is imported or run) and prints:
lines of code; functions with more than 8 parameters and functions over 60 lines (click commands
aside: their parameters are the command's options, one per flag); history marks in docstrings and
comments (issue or stop numbers, dates, "before/after" figures), which belong in docs/ and commit
messages; and retired import paths that warn. ``--list`` names each offender.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
import tokenize
from pathlib import Path

MAX_PARAMS = 8
MAX_LINES = 60
# "issue 43", "issue #12", "stop 55", "(#39)", a date, or before/after figures with a unit ("146 -> 112 ms").
HISTORY = re.compile(
    r"\bissues? #?\d+|\bstop \d+|\(#\d+\)|\b20\d\d-\d\d-\d\d\b"
    r"|\b\d[\d.,]*\s*(?:->|→)\s*\d[\d.,]*\s*(?:ms|s|x|%|MB|GB|/s|images|views|TFLOP|points|kernels|ops)\b",
    re.IGNORECASE,
)


def _is_click_command(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        text = ast.unparse(target)
        if text.startswith("click.") or text.endswith((".command", ".group")) or "option" in text or "argument" in text:
            return True
    return False


def _param_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    names = [n for n in names if n not in ("self", "cls")]
    return len(names) + (args.vararg is not None) + (args.kwarg is not None)


def _docstrings(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                found.append((node.body[0].lineno, doc))
    return found


def _comments(source: str) -> list[tuple[int, str]]:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [(tok.start[0], tok.string) for tok in tokens if tok.type == tokenize.COMMENT]


def measure(package: Path) -> dict[str, object]:
    lines = 0
    many_params: list[str] = []
    long_functions: list[str] = []
    history: list[str] = []
    for path in sorted(package.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        rel = path.relative_to(package.parent)
        lines += source.count("\n")
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_click_command(node):
                where = f"{rel}:{node.lineno} {node.name}"
                if (n := _param_count(node)) > MAX_PARAMS:
                    many_params.append(f"{where} ({n} parameters)")
                if (n := node.end_lineno - node.lineno + 1) > MAX_LINES:
                    long_functions.append(f"{where} ({n} lines)")
        for lineno, text in _docstrings(tree) + _comments(source):
            for match in HISTORY.finditer(text):
                history.append(f"{rel}:{lineno} {match.group(0)!r}")
    return {
        "lines": lines,
        f"functions_over_{MAX_PARAMS}_parameters": many_params,
        f"functions_over_{MAX_LINES}_lines": long_functions,
        "history_marks": history,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--package", default=str(Path(__file__).resolve().parents[1] / "cl_zoo"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--list", action="store_true", help="name every offender")
    args = ap.parse_args()
    result = measure(Path(args.package))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for key, value in result.items():
        print(f"{key}: {len(value) if isinstance(value, list) else value}")
        if args.list and isinstance(value, list):
            for item in value:
                print(f"    {item}")


if __name__ == "__main__":
    main()
