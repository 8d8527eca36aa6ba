"""Every retired import path warns once, names its replacement and removal release, and serves the very
object the new path does; nothing in cl_zoo itself imports a retired path."""

from __future__ import annotations

import ast
import importlib
import types
from pathlib import Path

import pytest

from cl_zoo.deprecations import REMOVED_IN, RETIRED_MODULES, RETIRED_NAMES, replacement
from tests.helpers import REPO_ROOT

# One public name per retired module, plus every retired name.
_CASES = [(old, name) for old, names in RETIRED_NAMES.items() for name in names] + [
    ("cl_zoo.search", "build_index"),
    ("cl_zoo.dedup_calibration", "calibrate_dedup_threshold"),
    ("cl_zoo.data.transforms", "resolve_data_config"),
    ("cl_zoo.convert.export", "export_timm"),
    ("cl_zoo.train.dist", "local_slice"),
]


def _fresh(module: types.ModuleType, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget a value an earlier read cached in the old module, so this read goes through the warning."""
    if name in vars(module):
        monkeypatch.delitem(vars(module), name)


@pytest.mark.parametrize(("old", "name"), _CASES, ids=[f"{m}.{n}" for m, n in _CASES])
def test_a_retired_name_warns_at_the_callers_line_and_is_the_new_object(
    old: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = importlib.import_module(old)
    new = replacement(old, name)
    assert new is not None
    _fresh(module, name, monkeypatch)
    with pytest.warns(DeprecationWarning) as record:
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(new), name)
    assert len(record) == 1
    assert str(record[0].message) == (
        f"{old}.{name} is deprecated and will be removed in cl-zoo {REMOVED_IN}; use {new}.{name}"
    )
    assert record[0].filename == __file__  # stacklevel: the line that used the old path, not ours
    getattr(module, name)  # warned once: a second read is a plain attribute


def test_from_import_of_a_retired_path_warns_too(monkeypatch: pytest.MonkeyPatch) -> None:
    import cl_zoo.search as old

    _fresh(old, "load_index", monkeypatch)
    with pytest.warns(DeprecationWarning, match="use cl_zoo.index.search.load_index") as record:
        from cl_zoo.search import load_index  # noqa: F401
    assert record[0].filename == __file__


def test_unknown_names_on_a_retired_module_still_raise_attribute_error() -> None:
    import cl_zoo.registry as registry
    import cl_zoo.search as old

    for module in (old, registry):
        with pytest.raises(AttributeError):
            module.no_such_name  # noqa: B018
    assert replacement("cl_zoo.registry", "get_pretrained") is None  # a name the registry owns is not retired


def _retired_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name in RETIRED_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in RETIRED_MODULES:
                found.append(node.module)
            found += [f"{node.module}.{a.name}" for a in node.names if a.name in RETIRED_NAMES.get(node.module, {})]
            found += [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in RETIRED_MODULES]
    return found


def test_nothing_in_the_package_imports_a_retired_path() -> None:
    shims = {REPO_ROOT / (m.replace(".", "/") + ".py") for m in RETIRED_MODULES}
    used = {
        str(path.relative_to(REPO_ROOT)): hits
        for path in sorted((REPO_ROOT / "cl_zoo").rglob("*.py"))
        if path not in shims and (hits := _retired_imports(path))
    }
    assert not used, used
