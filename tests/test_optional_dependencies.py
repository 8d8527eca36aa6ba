"""Extras: a plain install embeds a folder of images; every other feature's package comes with an
extra, and a command that needs a missing one ends in one line naming that extra.

A package is hidden by putting ``None`` in ``sys.modules`` (``import`` then raises
ModuleNotFoundError), so these tests run in the full test environment.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import tomllib
from pathlib import Path

import pytest

from cl_zoo import optional
from cl_zoo.cli import main
from cl_zoo.optional import EXTRAS, MissingExtraError, missing_message, require
from tests.helpers import REPO_ROOT, expect_extra, hide

REPO = REPO_ROOT
PHOTOS = REPO / "examples" / "photos"
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
OPTIONAL = PROJECT["optional-dependencies"]
# The distribution that provides each optional module (where the names differ).
DISTRIBUTION = {"faiss": "faiss-cpu", "fsspec": "fsspec[http]", "aiohttp": "fsspec[http]"}
# Extras for development only, not features: [all] need not include them.
NOT_FEATURES = {"all", "test"}


# ----------------------------------------------------------------------------- require()
def test_require_returns_the_module_or_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    assert require("json", "anything") is sys.modules["json"]
    hide(monkeypatch, "faiss")
    assert not optional.is_installed("faiss")
    with pytest.raises(MissingExtraError) as caught:
        require("faiss", "cl-zoo knn")
    assert str(caught.value) == "cl-zoo knn needs faiss, which is not installed: pip install 'cl-zoo[index]'"
    # A submodule names its package; an explicit extra wins over the table.
    hide(monkeypatch, "pyarrow")
    with pytest.raises(MissingExtraError, match=r"^x needs pyarrow, which is not installed: pip install 'cl-zoo\[remote\]'$"):
        require("pyarrow.parquet", "x", extra="remote")
    assert missing_message(["openvino", "nncf"], "--precision int8", extra="int8") == (
        "--precision int8 needs openvino and nncf, which are not installed: pip install 'cl-zoo[int8]'")


def test_an_installed_package_that_fails_to_import_is_not_called_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "webdataset"
    broken.mkdir()
    (broken / "__init__.py").write_text("import a_dependency_that_is_gone\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "webdataset", raising=False)
    with pytest.raises(MissingExtraError) as caught:
        require("webdataset", "reading WebDataset tar shards")
    message = str(caught.value)
    assert "installed but does not import" in message and "a_dependency_that_is_gone" in message
    assert message.endswith("pip install 'cl-zoo[remote]'") and "\n" not in message


# ----------------------------------------------------------------------------- commands
def test_faiss_commands_name_the_index_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    hide(monkeypatch, "faiss")
    emb = str(tmp_path / "emb.npy")  # never read: faiss is checked first
    expect_extra(capsys, main(["knn", "--model", "m", "--train", "a", "--test", "b"]), "cl-zoo knn", "faiss", "index")
    expect_extra(capsys, main(["search", emb, "--query", str(PHOTOS)]), "cl-zoo search", "faiss", "index")
    expect_extra(capsys, main(["dedup", emb]), "cl-zoo dedup", "faiss", "index")
    expect_extra(capsys, main(["index", emb, "--out", str(tmp_path / "i.faiss"), "--max-memory", "1G"]), "cl-zoo index", "faiss", "index")


def test_faiss_library_paths_name_the_index_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from cl_zoo.eval.knn import knn_classify
    from cl_zoo.eval.report import library_versions
    from cl_zoo.index.search import build_index

    hide(monkeypatch, "faiss")
    x = np.eye(4, dtype=np.float32)
    with pytest.raises(MissingExtraError, match=r"kNN classification \(cl-zoo knn\) needs faiss.*cl-zoo\[index\]"):
        knn_classify(x, np.arange(4), x, np.arange(4), ks=(1,), temperature=0.07, num_classes=4)
    with pytest.raises(MissingExtraError, match=r"similarity search .* needs faiss.*cl-zoo\[index\]"):
        build_index(x)
    # A linear-eval report does not need faiss: it records that it is absent.
    assert library_versions()["faiss"] == "not installed"


def test_parquet_outputs_name_the_parquet_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    hide(monkeypatch, "pyarrow")
    expect_extra(capsys, main(["embed", str(PHOTOS), "--out", str(tmp_path / "e.parquet")]), "--out F.parquet", "pyarrow", "parquet")
    expect_extra(capsys, main(["embed", str(PHOTOS), "--out", f"{tmp_path / 'shards'}/"]),
                 "--out DIR/ (sharded embeddings)", "pyarrow", "parquet")
    listing = tmp_path / "list.parquet"
    listing.write_bytes(b"PAR1")
    code = main(["embed", str(listing), "--out", str(tmp_path / "e.npy")])
    expect_extra(capsys, code, "a .parquet list of paths", "pyarrow", "parquet")
    assert not list(tmp_path.glob("e.*")) and not (tmp_path / "shards").exists()


def test_plots_name_the_plots_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    hide(monkeypatch, "matplotlib", "matplotlib.pyplot")
    code = main(["linear-eval", "--model", "m", "--train", "a", "--test", "b", "--plot"])
    expect_extra(capsys, code, "--plot", "matplotlib", "plots")


def test_urls_and_tar_shards_name_the_remote_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = str(tmp_path / "e.npy")
    hide(monkeypatch, "aiohttp")  # fsspec itself comes with torch; its HTTP backend does not
    expect_extra(capsys, main(["embed", "https://example.invalid/a.jpg", "--out", out]), "reading https:// URLs", "aiohttp", "remote")
    listing = tmp_path / "urls.txt"  # URLs inside a local list are not opened while inputs are resolved
    listing.write_text("https://example.invalid/a.jpg\n")
    expect_extra(capsys, main(["embed", str(listing), "--out", out]), "reading https:// URLs", "aiohttp", "remote")
    hide(monkeypatch, "fsspec")
    expect_extra(capsys, main(["embed", "s3://bucket/a.jpg", "--out", out]), "reading s3:// URLs", "fsspec", "remote")

    shard = tmp_path / "data-000.tar"
    with tarfile.open(shard, "w") as tar:
        tar.add(next(PHOTOS.glob("*.jpg")), arcname="000.jpg")
    hide(monkeypatch, "webdataset")
    expect_extra(capsys, main(["embed", str(shard), "--out", out]), "reading WebDataset tar shards", "webdataset", "remote")
    hide(monkeypatch, "braceexpand")
    expect_extra(capsys, main(["embed", str(tmp_path / "data-{000..001}.tar"), "--out", out]),
                 "a brace pattern (data-{000..009}.tar)", "braceexpand", "remote")
    assert not Path(out).exists()


def test_detection_names_the_detection_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    voc = tmp_path / "voc"
    for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (voc / sub).mkdir(parents=True)
    for i, photo in enumerate(sorted(PHOTOS.glob("*.jpg"))[:2]):
        shutil.copy(photo, voc / "JPEGImages" / f"img{i}.jpg")
        (voc / "Annotations" / f"img{i}.xml").write_text(
            f"<annotation><filename>img{i}.jpg</filename><size><width>64</width><height>64</height><depth>3</depth></size>"
            "<object><name>shell</name><difficult>0</difficult><bndbox><xmin>5</xmin><ymin>5</ymin><xmax>40</xmax>"
            "<ymax>40</ymax></bndbox></object></annotation>")
    (voc / "ImageSets/Main/trainval.txt").write_text("img0\n")
    (voc / "ImageSets/Main/test.txt").write_text("img1\n")
    hide(monkeypatch, "pycocotools", "pycocotools.coco", "pycocotools.cocoeval")
    code = main(["detect", "--model", "m", "--data", str(voc), "--output", str(tmp_path / "run")])
    expect_extra(capsys, code, "COCO AP (detect --engine torchvision)", "pycocotools", "detection")
    assert not (tmp_path / "run").exists()  # refused before training, not after


def test_openvino_is_an_error_only_when_asked_for(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from cl_zoo.backends.select import resolve_backend

    hide(monkeypatch, "openvino")
    auto = resolve_backend("auto", "cpu", "fp32", images=10_000)
    assert auto.name == "torch" and auto.reason == missing_message("openvino", "the OpenVINO backend")
    code = main(["embed", str(PHOTOS), "--out", str(tmp_path / "e.npy"), "--backend", "openvino", "--precision", "fp32"])
    expect_extra(capsys, code, "--backend openvino", "openvino", "openvino")


def test_pretrain_logging_degrades_and_says_which_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from cl_zoo.train.logging import RunLogger

    hide(monkeypatch, "tensorboard", "matplotlib")
    logger = RunLogger(tmp_path, tensorboard=True)
    logger.log_epoch(1, {"loss": 1.0})
    assert logger.tb is None and logger.plot() is None and not (tmp_path / "curves.png").exists()
    assert (tmp_path / "metrics.csv").is_file()
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "TensorBoard logging needs tensorboard, which is not installed: pip install 'cl-zoo[train]'; the run goes on without it",
        "curves.png needs matplotlib, which is not installed: pip install 'cl-zoo[train]'; the model is exported without it",
    ]


# ----------------------------------------------------------------------------- the core install
BLOCK = sorted(set(EXTRAS) | {"torch.utils.tensorboard", "pyarrow.parquet", "matplotlib.pyplot"})


def run_blocked(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter where every optional package fails to import."""
    prelude = f"import sys\nfor name in {BLOCK!r}:\n    sys.modules[name] = None\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)


def test_the_core_install_embeds_a_folder_without_any_extra(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    done = run_blocked(f"""
        import cl_zoo, cl_zoo.cli
        from cl_zoo.cli import main
        assert main(["--help"]) == 0
        assert main(["models"]) == 0
        assert main(["info", cl_zoo.registry.DEFAULT_MODEL]) == 0
        sys.exit(main(["embed", {str(PHOTOS)!r}, "--out", "out/e.npy", "-q"]))
        """, tmp_path)
    assert done.returncode == 0, done.stderr
    import numpy as np

    assert np.load(tmp_path / "out" / "e.npy").shape[0] == len(list(PHOTOS.glob("*.jpg")))


@pytest.mark.slow
def test_the_core_install_pretrains_without_any_extra(tmp_path: Path) -> None:
    photos = sorted(PHOTOS.glob("*.jpg"))[:8]
    for i, photo in enumerate(photos):
        (tmp_path / "data" / "ab"[i % 2]).mkdir(parents=True, exist_ok=True)
        shutil.copy(photo, tmp_path / "data" / "ab"[i % 2])
    done = run_blocked("""
        from cl_zoo.cli import main
        sys.exit(main(["pretrain", "--recipe", "dcl_imagenette64_cpu", "--data", "data", "--val", "data", "--epochs", "1",
                       "--batch-size", "4", "--workers", "0", "--device", "cpu", "--out", "run", "--no-progress"]))
        """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run" / "model" / "config.json").is_file()
    for line in ("kNN monitor off: the kNN monitor needs faiss, which is not installed: pip install 'cl-zoo[train]'",
                 "TensorBoard logging needs tensorboard, which is not installed: pip install 'cl-zoo[train]'",
                 "curves.png needs matplotlib, which is not installed: pip install 'cl-zoo[train]'"):
        assert line in done.stdout, done.stdout


def test_no_module_imports_an_optional_package_at_import_time() -> None:
    """Module-level imports run on ``import cl_zoo`` / ``cl-zoo --help``; optional ones belong in functions."""
    offenders = []
    for path in sorted((REPO / "cl_zoo").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _module_level(tree.body):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                if name.partition(".")[0] in EXTRAS or name.startswith("torch.utils.tensorboard"):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} imports {name}")
    assert not offenders, offenders


def _module_level(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
            found += _module_level(node.body) + _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            found += _module_level(node.body) + _module_level(node.orelse) + _module_level(node.finalbody)
    return found


# ----------------------------------------------------------------------------- pyproject.toml
def _requirements(extra: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """An extra's requirements with ``cl-zoo[a,b]`` self-references expanded."""
    out: set[str] = set()
    for req in OPTIONAL[extra]:
        inner = re.fullmatch(r"cl-zoo\[([a-z0-9,\- ]+)\]", req)
        if inner:
            for name in inner.group(1).split(","):
                assert name.strip() in OPTIONAL and name.strip() not in seen, req
                out |= _requirements(name.strip(), seen | {extra})
        else:
            out.add(req)
    return out


def _dist(requirement: str) -> str:
    return re.split(r"[<>=!~;\s]", requirement, maxsplit=1)[0].lower()


def test_torch_is_a_range_and_the_core_holds_no_optional_package() -> None:
    deps = {_dist(r): r for r in PROJECT["dependencies"]}
    assert deps["torch"].replace(" ", "") == "torch>=2.5" and deps["torchvision"].replace(" ", "") == "torchvision>=0.20"
    assert not any("==" in r for r in PROJECT["dependencies"]), PROJECT["dependencies"]
    optional_dists = {DISTRIBUTION.get(m, m).partition("[")[0] for m in EXTRAS}
    assert not optional_dists & {d.partition("[")[0] for d in deps}


def test_every_extra_named_in_a_message_exists_and_installs_its_package() -> None:
    for module, extra in EXTRAS.items():
        assert extra in OPTIONAL, f"{module}: extra [{extra}] is not in pyproject.toml"
        assert DISTRIBUTION.get(module, module) in {_dist(r) for r in _requirements(extra)}, (module, extra)
    # extra= overrides in the code: each names an extra that installs the package it is given for.
    for path in (REPO / "cl_zoo").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in ("require", "missing_message"):
                first = node.args[0] if node.args else None
                modules = [first.value] if isinstance(first, ast.Constant) else []
                assert not first or modules or isinstance(first, (ast.Name, ast.List)), f"{path}:{node.lineno}"
                for module in modules:
                    assert module.partition(".")[0] in EXTRAS, f"{path}:{node.lineno}: {module} is not in optional.EXTRAS"
                for kw in node.keywords:
                    if kw.arg == "extra" and isinstance(kw.value, ast.Constant):
                        assert kw.value.value in OPTIONAL, f"{path}:{node.lineno}: [{kw.value.value}]"
                        for module in modules:
                            want = DISTRIBUTION.get(module.partition(".")[0], module.partition(".")[0])
                            assert want in {_dist(r) for r in _requirements(kw.value.value)}, f"{path}:{node.lineno}"


def test_all_covers_every_feature_extra_and_test_covers_all() -> None:
    everything = _requirements("all")
    for extra in set(OPTIONAL) - NOT_FEATURES:
        assert _requirements(extra) <= everything, f"[all] lacks [{extra}]"
    assert everything <= _requirements("test")
    assert {"pytest", "pytest-timeout", "hypothesis"} <= {_dist(r) for r in _requirements("test")}


def test_readme_installs_the_core_for_the_quick_start_and_everything_for_the_tests() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")

    def block(tag: str) -> str:
        found = re.search(rf"<!-- ci: {tag} -->\n```bash\n(.*?)```", readme, re.S)
        assert found, tag
        return found.group(1)

    assert re.search(r"\.venv/bin/pip install \.(\s|$)", block("install")) and "[" not in block("install")
    assert '.venv/bin/pip install -e ".[test]"' in block("test")
    # The extras table lives in the install page the README links; every extra is listed there.
    assert "docs/install.md" in readme
    install = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    for extra in set(OPTIONAL) - {"test"}:
        assert f"| `{extra}` |" in install, f"docs/install.md's extras table lacks [{extra}]"
