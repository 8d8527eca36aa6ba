"""One CLI vocabulary (issue 42): outputs checked before any model loads, typo suggestions, where a
checkpoint comes from, -q/--quiet and --json everywhere, help on every option, no surprise writes."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import click
import numpy as np
import pytest

from cl_zoo.cli import cli, main
from cl_zoo.registry import DEFAULT_MODEL
from tests.helpers import EXAMPLE_PHOTOS_DIR, TINY_PRETRAIN as TINY, make_folder, refuse_model_loads

PHOTOS = EXAMPLE_PHOTOS_DIR
PHOTO = PHOTOS / "pot.jpg"

# Every user-unwritable place of the issue: /proc refuses creating files, /sys refuses even root.
UNWRITABLE = ["/proc/e.npy", "/sys/e.npy"]


def one_error_line(capsys: pytest.CaptureFixture[str], code: int) -> str:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def no_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any model load fails the test: the output must be refused before one."""

    import cl_zoo.eval.baseline as baseline

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded before the output was checked")

    refuse_model_loads(monkeypatch)
    monkeypatch.setattr(baseline, "load_model_or_baseline", refuse)


def timed(argv: list[str]) -> tuple[int, float]:
    start = time.perf_counter()
    code = main(argv)
    return code, time.perf_counter() - start


# --------------------------------------------------------------------------------------------
# 1. every output checked first
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("out", [*UNWRITABLE, "/proc/edir/"])
def test_embed_unwritable_out_is_one_line_before_the_model(out: str, no_model_loads: None, capsys: pytest.CaptureFixture[str]) -> None:
    code, seconds = timed(["embed", str(PHOTOS), "--out", out])
    line = one_error_line(capsys, code)
    assert out.rstrip("/") in line and "cannot create files in" in line
    assert seconds < 5  # today's traceback came after ~14 s of model loading


def test_missing_parent_and_folder_as_file(tmp_path: Path, no_model_loads: None, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error_line(capsys, main(["embed", str(PHOTO), "--out", str(tmp_path / "nope" / "e.npy")]))
    assert "does not exist" in line and str(tmp_path / "nope") in line
    # (embed takes an existing folder as a shard folder; export's OUT is always a file)
    (tmp_path / "taken.pth").mkdir()
    line = one_error_line(capsys, main(["export", "torchvision", DEFAULT_MODEL, str(tmp_path / "taken.pth")]))
    assert "OUT" in line and "is a folder" in line


def _faiss() -> None:
    pytest.importorskip("faiss")


@pytest.mark.parametrize("command", [
    lambda out, tmp: ["index", str(tmp / "emb.npy"), "--out", out, "--max-memory", "1G"],
    lambda out, tmp: ["search", str(tmp / "emb.npy"), "--query", str(PHOTO), "--save-index", out],
    lambda out, tmp: ["knn", "--train", "cifar10", "--test", "cifar10", "--out", out],
    lambda out, tmp: ["linear-eval", "--train", "cifar10", "--test", "cifar10", "--out", out],
    lambda out, tmp: ["export", "torchvision", DEFAULT_MODEL, out],
    lambda out, tmp: ["import", "moco", str(tmp / "missing.pth.tar"), "--out", out.replace(".npy", "")],
    lambda out, tmp: ["pretrain", "--method", "dcl", "--data", str(tmp / "missing"), "--out", out.replace(".npy", "")],
], ids=["index", "search", "knn", "linear-eval", "export", "import", "pretrain"])
@pytest.mark.parametrize("out", UNWRITABLE)
def test_every_writing_command_checks_its_output_first(command, out: str, tmp_path: Path, no_model_loads: None,  # noqa: ANN001
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    argv = command(out, tmp_path)
    if argv[0] in ("index", "search", "knn"):
        _faiss()
    # The inputs are missing or never read: an error about them would mean the output came second.
    code, seconds = timed(argv)
    line = one_error_line(capsys, code)
    assert out.replace(".npy", "") in line and "cannot create files in" in line, line
    assert seconds < 5


def test_knn_default_report_folder_is_checked(tmp_path: Path, no_model_loads: None, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    _faiss()
    (tmp_path / "eval-reports").write_text("a file where the report folder goes")
    monkeypatch.chdir(tmp_path)
    line = one_error_line(capsys, main(["knn", "--train", "cifar10", "--test", "cifar10"]))
    assert "eval-reports" in line and "is a file" in line


def test_card_update_refuses_an_unwritable_folder(no_model_loads: None, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error_line(capsys, main(["card-update", "/proc/sys"]))
    assert "FOLDER /proc/sys" in line


# --------------------------------------------------------------------------------------------
# 2. typos and where checkpoints come from
# --------------------------------------------------------------------------------------------


def test_embed_model_typo_gets_the_registered_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error_line(capsys, main(["embed", str(PHOTO), "--model", "cacr_resnet18.imagenete64_cpu", "--out", str(tmp_path / "e.npy")]))
    assert "did you mean cacr_resnet18.imagenette64_cpu," in line
    assert not list(tmp_path.iterdir())


def test_info_typo_suggests_the_dcl_checkpoint_first(capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error_line(capsys, main(["info", "dcl_resnet81"]))
    assert "did you mean dcl_resnet18.imagenette64_cpu," in line and "cmc_resnet18_lab" not in line


def test_models_pretrained_says_where_each_checkpoint_loads_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CL_ZOO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CL_ZOO_MODEL_CARDS", raising=False)
    cached = tmp_path / "cache" / "releases" / "jcl_resnet50.in1k_official"
    cached.mkdir(parents=True)
    (cached / "config.json").write_text("{}")
    assert main(["models", "--pretrained", "--json"]) == 0
    here = {row["name"]: row["here"] for row in json.loads(capsys.readouterr().out)}
    assert here[DEFAULT_MODEL]["where"] in ("checkout", "wheel") and Path(here[DEFAULT_MODEL]["path"], "config.json").is_file()
    assert here["jcl_resnet50.in1k_official"] == {"where": "release cache", "path": str(cached)}
    assert here["cmc_resnet50x1_lab.in1k_official"]["where"] in ("download: publisher", "HF cache")

    cards = tmp_path / "cards"
    shutil.copytree(Path(here[DEFAULT_MODEL]["path"]), cards / DEFAULT_MODEL)
    monkeypatch.setenv("CL_ZOO_MODEL_CARDS", str(cards))
    assert main(["models", DEFAULT_MODEL]) == 0
    header, _, row = capsys.readouterr().out.splitlines()
    assert "here" in header.split() and "CL_ZOO_MODEL_CARDS" in row


# --------------------------------------------------------------------------------------------
# 3. one vocabulary
# --------------------------------------------------------------------------------------------


def all_commands() -> list[tuple[str, click.Command]]:
    found = []
    ctx = click.Context(cli)
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        assert command is not None
        if isinstance(command, click.Group):
            found += [(f"{name} {sub}", c) for sub, c in command.commands.items()]
        else:
            found.append((name, command))
    return found


def test_every_option_of_every_command_has_help() -> None:
    missing = [f"{name} {'/'.join(p.opts)}" for name, command in all_commands() for p in command.params
               if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()]
    assert not missing, f"options without help: {missing}"


def test_q_means_quiet_everywhere_and_summaries_have_json() -> None:
    commands = dict(all_commands())
    for name, command in commands.items():
        for param in command.params:
            if "-q" in getattr(param, "opts", []):
                assert "--quiet" in param.opts, f"{name}: -q is {param.opts}"
            if "-v" in getattr(param, "opts", []):
                assert "--verbose" in param.opts, f"{name}: -v is {param.opts}"
            if isinstance(param, click.Option) and "--output" in param.opts and name != "detect":
                raise AssertionError(f"{name} says --output; the vocabulary is --out")
    for name in ("embed", "pretrain", "index", "knn", "linear-eval", "search", "dedup", "models", "info", "card-update",
                 "export torchvision", "export timm", "export detectron2", "import"):
        assert any("--json" in getattr(p, "opts", []) for p in commands[name].params), name
    for name in ("embed", "index", "knn", "linear-eval", "pretrain"):
        opts = {o for p in commands[name].params for o in (*getattr(p, "opts", []), *getattr(p, "secondary_opts", []))}
        assert {"-q", "--quiet", "--progress", "--no-progress"} <= opts, name


def test_evaluation_defaults_match_the_tables() -> None:
    commands = dict(all_commands())
    for name in ("knn", "linear-eval"):
        model = next(p for p in commands[name].params if p.name == "model_spec")
        assert not model.required  # embed's default model, not a required -m
    temperature = next(p for p in commands["knn"].params if p.name == "temperature")
    assert temperature.default == 0.1


def test_search_old_dash_q_query_is_one_helpful_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error_line(capsys, main(["search", str(tmp_path / "emb.npy"), "-q", str(PHOTO)]))
    assert "-q means --quiet" in line and f"--query {PHOTO}" in line


# --------------------------------------------------------------------------------------------
# 4. no surprise writes; --resume on a finished run; summaries
# --------------------------------------------------------------------------------------------


def test_embed_without_out_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    line = one_error_line(capsys, main(["embed", str(PHOTO)]))
    assert "give --out" in line
    assert not list(tmp_path.iterdir())


def test_embed_one_image_resume_finished_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "e.npy"
    assert main(["embed", str(PHOTO), "--out", str(out), "-q", "-j", "0"]) == 0
    err = capsys.readouterr().err
    assert f"embedded 1 image (512-d) into {out}," in err
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}

    assert main(["embed", str(PHOTO), "--out", str(out), "--resume", "-j", "0"]) == 0
    err = capsys.readouterr().err
    assert "already finished (1 image of these inputs); nothing to resume" in err
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before  # nothing embedded or rewritten

    # Other inputs: --resume would replace a finished output with another run's, so it is refused...
    assert main(["embed", str(PHOTOS), "--out", str(out), "--resume", "--json", "-q", "-j", "0"]) == 2
    assert "finished run over other inputs" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before
    # ...and a run without it embeds them, --json reporting on stdout.
    assert main(["embed", str(PHOTOS), "--out", str(out), "--json", "-q", "-j", "0"]) == 0
    out_text, err = capsys.readouterr()
    summary = json.loads(out_text)
    assert summary["images"] == len(list(PHOTOS.glob("*.jpg"))) and summary["output"] == str(out) and "embedded" not in err


def test_index_names_both_files_with_their_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _faiss()
    from cl_zoo.embedding import save_embeddings

    rng = np.random.default_rng(0)
    save_embeddings(tmp_path / "emb.npy", rng.standard_normal((64, 8)).astype(np.float32),
                    [f"/x/{i}.jpg" for i in range(64)], {"model": DEFAULT_MODEL})
    (tmp_path / "runs").mkdir()
    out = tmp_path / "runs" / "emb.faiss"
    assert main(["index", str(tmp_path / "emb.npy"), "--out", str(out), "--max-memory", "1M", "--no-progress"]) == 0
    stdout, err = capsys.readouterr()
    assert f"wrote {out} and {out}.json" in stdout and not err



def test_export_json_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tv.pth"
    assert main(["export", "torchvision", DEFAULT_MODEL, str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["path"] == str(out) and summary["target"] == "torchvision" and summary["depth"] == 18 and out.is_file()


def test_folder_outputs_refuse_a_file_and_create_missing_parents(tmp_path: Path, no_model_loads: None,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run").write_text("a file where the run folder goes")
    line = one_error_line(capsys, main(["pretrain", "--method", "dcl", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "run")]))
    assert "is a file; a folder is written there" in line
    # A run folder's missing parents are made (as the trainer does): the next error is about the data.
    line = one_error_line(capsys, main(["pretrain", "--method", "dcl", "--data", str(tmp_path / "missing"),
                                        "--out", str(tmp_path / "runs" / "new" / "x")]))
    assert "--out" not in line and "missing" in line


def test_card_update_rerender_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cl_zoo.checkpoint.hub import find_bundled

    folder = tmp_path / "card"
    shutil.copytree(find_bundled(DEFAULT_MODEL), folder)
    assert main(["card-update", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"card": str(folder / "README.md"), "config": str(folder / "config.json")}


def test_pretrain_json_keeps_stdout_for_the_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:

    monkeypatch.setenv("CL_ZOO_CACHE", str(tmp_path / "cache"))
    data = make_folder(tmp_path / "data")
    out = tmp_path / "run"
    assert main(["pretrain", "-q", "--json", "--recipe", "dcl_cifar10", *TINY, "--data", str(data), "--epochs", "1",
                 "--batch-size", "16", "--knn-every", "0", "--workers", "0", "--device", "cpu", "--out", str(out)]) == 0
    stdout, err = capsys.readouterr()
    result = json.loads(stdout)  # the trainer's log lines went to stderr
    assert result["run"] == str(out) and result["epochs"] == 1 and Path(result["model"], "config.json").is_file()
    assert "epoch 1/1" in err
