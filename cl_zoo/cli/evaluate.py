"""``cl-zoo knn``, ``cl-zoo linear-eval`` and ``cl-zoo card-update``.

The commands parse arguments and call :mod:`cl_zoo.eval`; every run writes a JSON report (and, with
``--plot``, PNG figures beside it) so that a number on a model card can be traced to the exact
weights, data and settings that produced it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable

import click

from cl_zoo.errors import DataError
from cl_zoo.validation import check_numbers, InvalidValueError, MAX_SEED


def _parse_ints(text: str, what: str) -> list[int]:
    """A comma-separated list of whole numbers >= 1 (``--k 20,200``); an empty item is refused, not skipped."""
    return [int(v) for v in check_numbers(what, _parse_numbers(text, what, "whole numbers"), low=1, integer=True)]


def _parse_floats(text: str, what: str) -> list[float]:
    """A comma-separated list of numbers; their ranges are checked where they are used."""
    return [float(v) for v in _parse_numbers(text, what, "numbers")]


def _parse_numbers(text: str, what: str, kind: str) -> list[int | float]:
    items = text.replace(" ", "").split(",")
    try:
        if not all(items):
            raise ValueError(text)
        return [_number(v) for v in items]
    except ValueError:
        raise InvalidValueError(f"{what} must be comma-separated {kind}, got {text!r}") from None


def _number(text: str) -> int | float:
    """An int where the text is one (so a message shows ``0``, not ``0.0``), else a float."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def _device(device: str | None) -> str | None:
    """Validate ``--device`` up front (one-line error for cuda on a CPU-only machine)."""
    if device is None or device == "auto":
        return None
    from cl_zoo.embedding import resolve_device

    return str(resolve_device(device))


def _open_splits(train: str, test: str, root: str | None, train_split: str | None, test_split: str | None, per_class: int | None) -> tuple[Any, Any]:
    from cl_zoo.eval.features import check_same_classes, first_per_class, open_eval_split

    train_data = open_eval_split(train, root, train_split, "train")
    test_data = open_eval_split(test, root, test_split, "test")
    check_same_classes(train_data.classes, test_data.classes)
    if per_class is not None:
        train_data, test_data = first_per_class(train_data, per_class), first_per_class(test_data, per_class)
    if set(map(str, train_data.paths)) == set(map(str, test_data.paths)):
        click.echo("warning: train and test are the same images; accuracies will be optimistic", err=True)
    return train_data, test_data


REPORTS_FOLDER = "eval-reports"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:80] or "model"


def _report_path(out: str | None, task: str, result: Any) -> Path:
    if out is not None:
        return Path(out)
    report = result.report
    name = _slug(f"{task}-{report['model']['name']}-{report['data']['name']}-{report['protocol']}-seed{report['seed']}")
    return Path(REPORTS_FOLDER) / f"{name}-{_location_digest(report['data'])}-{report['model']['weights_sha256'][:8]}.json"


def _location_digest(data: dict[str, Any]) -> str:
    """8 hex digits of where the train and test data resolve to: two datasets whose folders share a
    name (both ``train/``) get reports of their own instead of replacing each other's."""
    import hashlib

    sources = [str(data.get(split, {}).get("source", "")) for split in ("train", "test")]
    resolved = [os.path.realpath(s) if s and os.path.exists(s) else s for s in sources]
    return hashlib.sha256(json.dumps(resolved).encode("utf-8", "surrogatepass")).hexdigest()[:8]


def _require_plots(plot: bool) -> None:
    """--plot's matplotlib, checked before features are extracted rather than after."""
    if plot:
        from cl_zoo.optional import require

        require("matplotlib", "--plot")


def _finish(result: Any, task: str, out: str | None, plot: bool, as_json: bool) -> None:
    from cl_zoo.eval.report import summary_lines, write_json_atomic

    path = _report_path(out, task, result)
    figures: dict[str, str] = {}
    if plot:
        from cl_zoo.eval import plots

        stem = path.with_suffix("")
        cm = plots.confusion_matrix(result.test_labels, result.predictions[:, 0], len(result.classes))
        figures["confusion"] = str(plots.plot_confusion(cm, result.classes, f"{stem}-confusion.png"))
        if result.test_features is not None:
            figures["projection"] = str(plots.plot_projection(result.test_features, result.test_labels, result.classes, f"{stem}-pca.png", seed=result.report["seed"]))
        if result.curve:
            figures["curve"] = str(plots.plot_curve(result.curve, f"{stem}-curve.png"))
        result.report["figures"] = {k: Path(v).name for k, v in figures.items()}
    write_json_atomic(result.report, path)
    if as_json:
        click.echo(json.dumps(result.report, indent=2))
    else:
        for line in summary_lines(result.report):
            click.echo(line)
        click.echo(f"  report: {path}" + (f" (+ {len(figures)} figures)" if figures else ""))


def _preflight(model_spec: str | None, out: str | None, progress: bool, quiet: bool, workers: int | None) -> tuple[str, bool, int]:
    """The model (embed's default when none is named), the progress setting and the decoding
    workers, with the report's place checked first: before the data code is imported (torchvision
    takes seconds), data opened or features extracted, so a bad --out costs nothing."""
    from cl_zoo.fileio import check_output_path
    from cl_zoo.registry import DEFAULT_MODEL

    if out is not None:
        check_output_path(out, create_parents=True)
    else:
        check_output_path(REPORTS_FOLDER, folder=True, create_parents=True, option="the default report folder")
    from cl_zoo.data.workers import default_workers

    return model_spec or DEFAULT_MODEL, progress and not quiet, default_workers() if workers is None else workers


def _progress_default(ctx: click.Context, param: click.Parameter, value: bool | None) -> bool:
    # Feature extraction over CIFAR-10 takes about a minute on a laptop CPU: silence reads as a hang.
    import sys

    return sys.stderr.isatty() if value is None else value


def _common(fn: Callable) -> Callable:
    options = [
        click.option("--model", "-m", "model_spec", default=None,
                     help="Registered name, checkpoint folder/file or hf-hub:owner/name[@rev] (default: the bundled model, as cl-zoo embed)."),
        click.option("--random-init", is_flag=True, help="Seeded random weights with --model's architecture and preprocessing (a registry name or a checkpoint folder): the baseline."),
        click.option("--train", "train", required=True, help="ImageFolder dir, archive of one, or cifar10/cifar100/stl10/imagenette."),
        click.option("--test", "test", required=True, help="Same forms as --train."),
        # --root: the name this option had before every command called it --data-root.
        click.option("--data-root", "--root", "root", default=None, help="Where named datasets live (default $CL_ZOO_DATA or ./data)."),
        click.option("--train-split", default=None, help="Split folder for --train (default: train, or the folder itself)."),
        click.option("--test-split", default=None, help="Split folder for --test (default: test, then val, or the folder itself)."),
        click.option("--per-class", type=click.IntRange(min=1), default=None, help="Use only the first N images of each class (sorted order) of both splits."),
        click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True, help="Feature-extraction batch size."),
        click.option("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda when available)."),
        click.option("-j", "--workers", type=click.IntRange(min=0), default=None,
                     help="Image-decoding worker processes (default: the usable CPUs, at most 8)."),
        click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16", "int8"]), default="auto", show_default=True,
                     help="Feature extraction: auto is bf16 on CUDA and on CPUs with AMX or AVX512_BF16, else fp32. "
                          "int8 (cl-zoo[int8]) calibrates on 512 train images (--seed) and is used only if it keeps "
                          "neighbour recall@10 >= 0.95 against fp32 on the held-out half."),
        click.option("--force-int8", is_flag=True, help="Use int8 even if it fails its fidelity gate."),
        click.option("--backend", type=click.Choice(["auto", "torch", "openvino"]), default="auto", show_default=True,
                     help="Feature extraction engine: auto uses OpenVINO on CPU when installed and worth converting."),
        click.option("--no-cache", is_flag=True, help="Recompute features instead of using (and filling) the feature cache."),
        click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True, help="Seed of the sampling, the probe and --random-init weights."),
        click.option("--out", "out", default=None, help="Report path (default eval-reports/<task>-<model>-<data>-<protocol>-seed<N>-<where8>-<sha8>.json)."),
        click.option("--plot", is_flag=True, help="Also write PNGs beside the report: confusion matrix, PCA of test features, training curve."),
        click.option("--json", "as_json", is_flag=True, help="Print the report to stdout instead of a summary."),
        click.option("--progress/--no-progress", default=None, callback=_progress_default,
                     help="Progress bars on stderr (default: on when stderr is a terminal, off with --quiet)."),
        click.option("-q", "--quiet", is_flag=True,
                     help="Quiet: no progress bars (as --no-progress) nor linear-eval's fit log; the summary, warnings and errors still print."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


@click.command("knn")
@_common
@click.option("--k", "k", default="20,200", show_default=True, help="Neighbour counts, comma-separated; one search serves all.")
@click.option("--temperature", "-t", type=float, default=0.1, show_default=True,
              help="Vote weight exp(sim / T); 0.1 is what every table and model card in the zoo used.")
@click.option("--metric", type=click.Choice(["cosine", "l2"]), default="cosine", show_default=True, help="Similarity of the neighbour search.")
def knn_command(model_spec: str, random_init: bool, train: str, test: str, root: str | None, train_split: str | None,
                test_split: str | None, per_class: int | None, batch_size: int, device: str | None, workers: int | None,
                precision: str, force_int8: bool, backend: str, no_cache: bool, seed: int, out: str | None, plot: bool,
                as_json: bool, progress: bool, quiet: bool, k: str,
                temperature: float, metric: str) -> None:
    """Weighted kNN (InstDisc vote) top-1/top-5 of a model's frozen features."""
    from cl_zoo.eval.knn import check_knn_settings, evaluate_knn

    ks = check_knn_settings(_parse_ints(k, "--k"), temperature, metric)
    model_spec, progress, workers = _preflight(model_spec, out, progress, quiet, workers)
    from cl_zoo.index.search import require_faiss

    require_faiss("cl-zoo knn")  # before any feature is extracted
    _require_plots(plot)
    device = _device(device)
    train_data, test_data = _open_splits(train, test, root, train_split, test_split, per_class)
    from cl_zoo.eval.baseline import load_model_or_baseline

    model = load_model_or_baseline(model_spec, random_init, seed)
    result = evaluate_knn(
        model, train_data, test_data, ks=ks, temperature=temperature, metric=metric, seed=seed, batch_size=batch_size,
        device=device, workers=workers, cache=not no_cache, progress=progress, precision=precision, backend=backend,
        force_int8=force_int8, extra_hyperparameters={"per_class": per_class, "random_init": random_init},
    )
    _finish(result, "knn", out, plot, as_json)


@click.command("linear-eval")
@_common
@click.option("--protocol", type=click.Choice(["fast", "paper", "small-scale"]), default="fast", show_default=True,
              help="fast: cached features + L-BFGS; paper: the ImageNet SGD schedule; small-scale: CACR's Adam schedule.")
@click.option("--wd-grid", default="1e-6,1e-5,1e-4,1e-3,1e-2,1e-1", show_default=True, help="fast: weight decays tried on the held-out part.")
@click.option("--val-fraction", type=float, default=0.1, show_default=True, help="fast: share of train held out to pick the weight decay.")
@click.option("--max-iter", type=int, default=300, show_default=True, help="fast: L-BFGS iterations per fit.")
@click.option("--epochs", type=int, default=None, help="paper/small-scale: epochs (default 100).")
@click.option("--lr", type=float, default=None, help="paper/small-scale: learning rate (default 30 / 1e-3).")
@click.option("--milestones", default=None, help="paper/small-scale: epochs where lr is multiplied by --gamma (default 60,80).")
@click.option("--gamma", type=float, default=None, help="paper/small-scale: lr factor at milestones (default 0.1 / 0.2).")
@click.option("--train-batch-size", type=int, default=None, help="paper/small-scale: linear-training batch (default 256 / 128).")
@click.option("--momentum", type=float, default=None, help="paper: SGD momentum (default 0.9).")
@click.option("--betas", default=None, help="small-scale: Adam betas (default 0.5,0.999).")
@click.option("--weight-decay", type=float, default=None, help="paper/small-scale: weight decay (default 0).")
@click.option("--optimizer", type=click.Choice(["sgd", "adam"]), default=None, help="paper/small-scale: override the optimizer.")
def linear_eval_command(model_spec: str, random_init: bool, train: str, test: str, root: str | None, train_split: str | None,
                        test_split: str | None, per_class: int | None, batch_size: int, device: str | None, workers: int | None,
                        precision: str, force_int8: bool, backend: str, no_cache: bool, seed: int, out: str | None,
                        plot: bool, as_json: bool, progress: bool, quiet: bool,
                        protocol: str, wd_grid: str, val_fraction: float, max_iter: int, epochs: int | None,
                        lr: float | None, milestones: str | None, gamma: float | None, train_batch_size: int | None,
                        momentum: float | None, betas: str | None, weight_decay: float | None, optimizer: str | None) -> None:
    """Linear probe of a frozen model: fast (cached features + L-BFGS), paper (ImageNet) or small-scale (CACR)."""
    overrides: dict[str, Any] = {
        "epochs": epochs, "lr": lr, "gamma": gamma, "batch_size": train_batch_size, "momentum": momentum,
        "weight_decay": weight_decay, "optimizer": optimizer,
    }
    if milestones is not None:
        overrides["milestones"] = tuple(_parse_ints(milestones, "--milestones"))
    if betas is not None:
        overrides["betas"] = tuple(_parse_floats(betas, "--betas"))
    grid = _check_protocol_options(protocol, overrides, _parse_floats(wd_grid, "--wd-grid"), val_fraction, max_iter)
    model_spec, progress, workers = _preflight(model_spec, out, progress, quiet, workers)
    overrides["workers"] = workers
    from cl_zoo.eval.linear import evaluate_linear

    _require_plots(plot)
    device = _device(device)
    train_data, test_data = _open_splits(train, test, root, train_split, test_split, per_class)
    from cl_zoo.eval.baseline import load_model_or_baseline

    model = load_model_or_baseline(model_spec, random_init, seed)
    result = evaluate_linear(
        model, train_data, test_data, protocol_name=protocol, seed=seed, overrides=overrides, wd_grid=grid,
        val_fraction=val_fraction, max_iter=max_iter, batch_size=batch_size, device=device, workers=workers,
        cache=not no_cache, progress=progress, want_test_features=plot, precision=precision, backend=backend,
        force_int8=force_int8, extra_hyperparameters={"per_class": per_class, "random_init": random_init},
        log=None if as_json or quiet else (lambda line: click.echo(line, err=True)),
    )
    _finish(result, "linear", out, plot, as_json)


# The linear-eval options of one protocol only, by parameter name.
FAST_ONLY = {"wd_grid": "--wd-grid", "val_fraction": "--val-fraction", "max_iter": "--max-iter"}
AUGMENTED_ONLY = {"epochs": "--epochs", "lr": "--lr", "milestones": "--milestones", "gamma": "--gamma",
                  "batch_size": "--train-batch-size", "momentum": "--momentum", "betas": "--betas",
                  "weight_decay": "--weight-decay", "optimizer": "--optimizer"}


def _check_protocol_options(protocol_name: str, overrides: dict[str, Any], wd_grid: list[float], val_fraction: float,
                            max_iter: int) -> list[float]:
    """The weight-decay grid, once every linear-eval setting is in range and applies to ``protocol_name``.

    Checked before the report's place, the data or the model are touched. A setting of the other
    protocols is refused rather than ignored: a run that silently dropped ``--max-iter 0`` or
    ``--epochs 3`` reports numbers the user did not ask for.
    """
    from cl_zoo.eval.linear import check_fast_settings, protocol

    grid = check_fast_settings(wd_grid, val_fraction, max_iter)
    given = [name for name, value in overrides.items() if value is not None]
    if protocol_name == "fast":
        if given:
            raise DataError(f"{AUGMENTED_ONLY[given[0]]} applies to the paper/small-scale protocols, not fast")
        return grid
    context = click.get_current_context()
    for name, option in FAST_ONLY.items():
        if context.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE:
            raise DataError(f"{option} applies to the fast protocol, not {protocol_name}")
    protocol(protocol_name, **overrides)
    return grid


@click.command("card-update")
@click.argument("folder", type=click.Path(file_okay=False))
@click.argument("report", type=click.Path(dir_okay=False), required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the updated metrics (or the re-rendered card's path) as JSON.")
def card_update_command(folder: str, report: str | None, as_json: bool) -> None:
    """Write a report's metrics into FOLDER's config.json and model card (model-index).

    Without REPORT, re-render FOLDER's README.md from its config.json (hand-added sections kept):
    the How to load section `cl-zoo publish` accepts is the one cl-zoo generates.
    """
    from cl_zoo.eval.report import update_card
    from cl_zoo.fileio import check_output_path

    if Path(folder).exists():  # its config.json and README.md are rewritten: refuse an unwritable folder before loading the model
        check_output_path(folder, folder=True, option="FOLDER")
    if report is None:
        from cl_zoo.checkpoint.folder import rerender_card

        card = rerender_card(folder)
        if as_json:
            click.echo(json.dumps({"card": str(card), "config": str(Path(folder) / "config.json")}, indent=2))
        else:
            click.echo(f"re-rendered {card} from {Path(folder) / 'config.json'}")
        return

    metrics = update_card(folder, report)
    if as_json:
        click.echo(json.dumps(metrics, indent=2))
    else:
        for key, value in metrics.items():
            click.echo(f"{key:<40} {value:.4f}")
        click.echo(f"updated {Path(folder) / 'config.json'} and {Path(folder) / 'README.md'}")
