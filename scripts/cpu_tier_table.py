"""The CPU-tier tables of docs/cpu-tier.md (linked from the README), generated from the published folders so it cannot drift from them.

    python scripts/cpu_tier_table.py            # print the table
    python scripts/cpu_tier_table.py --write    # replace the tables in docs/cpu-tier.md (between their markers)
    python scripts/cpu_tier_table.py --check    # exit 1 when docs/cpu-tier.md differs (tests/project/test_cpu_tier.py)

Every figure comes from ``model_cards/<method>_resnet18.imagenette64_cpu/config.json`` (``cpu_tier``,
written by scripts/bundle_cpu_tier.py from the evaluation reports in the same folder). A row with
several seeds (the published one plus ``cpu_tier.other_seeds``) shows mean ± sample standard deviation
(n - 1) of the float16 scores, and each seed's kNN k=200; rows are ordered by mean kNN k=200.

The transfer table (``cpu_tier.transfer``, scripts/tier_transfer.py) has each checkpoint's CIFAR-10 fast
linear probe and BCCD detection AP (mean ± sample sd over fine-tune seeds, the count in brackets), and
each architecture's random init.

The claims table reads each comparison docs/cpu-tier.md makes (``CLAIMS``) as the gap between two rows'
means against twice their pooled sample sd: sqrt(((n_a - 1) s_a^2 + (n_b - 1) s_b^2) / (n_a + n_b - 2)).

The controls table (``cpu_tier.controls``, scripts/bundle_cpu_tier.py's ``CONTROLS``) puts each control
run beside the method it is read against: the change it made, its seeds, the same statistics, and the
gap of the compared method's mean to the control's mean.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Where the tables live: the README links them, so the front page stays short (issue 42).
DOC = REPO / "docs" / "cpu-tier.md"
sys.path.insert(0, str(REPO / "scripts"))
from bundle_cpu_tier import CONTROLS, device_label, read_json  # noqa: E402

METHODS = ("simclr", "mocov2", "dcl", "dclw", "simo", "jcl", "cmc", "cacr")
LABELS = {"simclr": "SimCLR", "mocov2": "MoCo v2", "dcl": "DCL", "dclw": "DCLW", "simo": "SiMo (EqCo)",
          "jcl": "JCL", "cmc": "CMC (L/ab)", "cacr": "CACR"}
BEGIN, END = "<!-- cpu-tier-table -->", "<!-- /cpu-tier-table -->"
CONTROLS_BEGIN, CONTROLS_END = "<!-- cpu-tier-controls -->", "<!-- /cpu-tier-controls -->"
TRANSFER_BEGIN, TRANSFER_END = "<!-- cpu-tier-transfer -->", "<!-- /cpu-tier-transfer -->"
CLAIMS_BEGIN, CLAIMS_END = "<!-- cpu-tier-claims -->", "<!-- /cpu-tier-claims -->"

# The comparisons docs/cpu-tier.md's prose makes (issue 23): (claim, row A, row B); a row is a tier method or
# ``control:NAME``. Each is read as mean(A) - mean(B) against twice the pooled seed sd.
CLAIMS = (
    ("DCL vs SimCLR (decoupling + temperature)", "dcl", "simclr"),
    ("DCL vs SimCLR at τ=0.1 (decoupling alone)", "dcl", "control:simclr_tau0.1"),
    ("JCL vs MoCo v2", "jcl", "mocov2"),
    ("CACR vs SimCLR (weighting + views)", "cacr", "simclr"),
    ("CACR vs DCL at 150 views/image (weighting alone)", "cacr", "control:dcl_150views"),
    ("SiMo, K=16 vs MoCo v2's queue of 2048", "simo", "mocov2"),
    ("CMC: L/ab from two crops vs one", "cmc", "control:cmc_sharedcrop"),
)


def tier_rows(cards: Path) -> list[dict]:
    rows = []
    for method in METHODS:
        config = cards / f"{method}_resnet18.imagenette64_cpu" / "config.json"
        if config.is_file():
            data = read_json(config)
            rows.append({"method": method, "name": data["model_name"], "arch": data["architecture"], **data["cpu_tier"]})
    return rows


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


METRICS = ("knn_k20_top1", "knn_k200_top1", "linear_fast_top1")


def seed_values(row: dict, metric: str) -> list[float]:
    """The float16 (published) scores of every seed of a row, the published seed first."""
    values = [row["fp16_top1"].get(metric)] + [o["fp16_top1"].get(metric) for o in row.get("other_seeds") or []]
    return [float(v) for v in values if v is not None]


def mean_sd(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (n - 1); no deviation from a single seed."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5


def spread(values: list[float]) -> str:
    """``47.31 ± 0.40%`` over the seeds (points), or the single value."""
    if not values:
        return "-"
    mean, sd = mean_sd(values)
    return pct(mean) if sd is None else f"{100 * mean:.2f} ± {100 * sd:.2f}%"


def render(cards: Path = REPO / "model_cards") -> str:
    rows = tier_rows(cards)
    lines = [
        "| method | checkpoint | seeds | kNN k=20 | kNN k=200 | linear (fast) | kNN k=200 per seed | train time (epochs x median) | views/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: -mean_sd(seed_values(r, "knn_k200_top1"))[0]):
        per_seed = ", ".join(
            f"{pct(v)} (seed {seed}{label})" for (seed, label), v in zip(
                [(r.get("seed", 0), "")] + [(o["seed"], device_label(o)) for o in r.get("other_seeds") or []],
                seed_values(r, "knn_k200_top1"))
        )
        lines.append(
            f"| {LABELS[r['method']]} | `{r['name']}` | {len(seed_values(r, 'knn_k200_top1'))} | "
            + " | ".join(spread(seed_values(r, m)) for m in METRICS)
            + f" | {per_seed} | {r['epochs'] * r['epoch_time_median_s'] / 60:.0f} min | {r['views_per_s']:.0f} |"
        )
    baselines = {}
    for r in rows:
        baselines.setdefault(r["arch"], r["random_init_top1"])
    for arch, top in baselines.items():
        lines.append(
            f"| random init | `{arch}` | - | {pct(top.get('knn_k20_top1'))} | {pct(top.get('knn_k200_top1'))} | "
            f"{pct(top.get('linear_fast_top1'))} | - | - | - |"
        )
    missing = [LABELS[m] for m in METHODS if m not in {r["method"] for r in rows}]
    if missing:
        lines += ["", f"Not published yet: {', '.join(missing)}."]
    return "\n".join(lines)


def control_rows(cards: Path) -> dict[str, list[dict]]:
    """Control name -> its seeds (``cpu_tier.controls`` entries), in the order of ``CONTROLS``."""
    found: dict[str, list[dict]] = {}
    for row in tier_rows(cards):
        for entry in row.get("controls") or []:
            found.setdefault(entry["name"], []).append(entry)
    order = list(CONTROLS)
    return {name: sorted(found[name], key=lambda e: e["seed"])
            for name in sorted(found, key=lambda n: order.index(n) if n in order else len(order))}


def render_controls(cards: Path = REPO / "model_cards") -> str:
    rows = {r["method"]: r for r in tier_rows(cards)}
    lines = [
        "| control | change from the published recipe | read against | seeds | kNN k=20 | kNN k=200 | linear (fast) | "
        "kNN k=200 per seed | compared method's kNN k=200 | gap (compared - control) | train time (epochs x median) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    found = control_rows(cards)
    for name, seeds in found.items():
        control = CONTROLS.get(name)
        label = control.label if control else name
        change = "; ".join(f"`{k}` {a} → {b}" for k, (a, b) in seeds[0]["changes"].items())
        versus = rows.get(control.compared_with) if control else None
        own = [[float(e["fp16_top1"][m]) for e in seeds if e["fp16_top1"].get(m) is not None] for m in METRICS]
        per_seed = ", ".join(f"{pct(e['fp16_top1'].get('knn_k200_top1'))} (seed {e['seed']}{device_label(e)})" for e in seeds)
        if versus is not None:
            theirs = seed_values(versus, "knn_k200_top1")
            compared = f"{LABELS[versus['method']]}: {spread(theirs)} ({len(theirs)} seed{'s' if len(theirs) != 1 else ''})"
            gap = f"{100 * (mean_sd(theirs)[0] - mean_sd(own[1])[0]):+.2f} pt" if own[1] else "-"
        else:
            compared, gap = "-", "-"
        # Like the tier table: epochs x the median epoch time (of the CPU seeds' medians: the column is the
        # 2-core CPU's time, and a GPU seed's epoch is ten times shorter), which a run slowed by other work
        # on the machine for a while (or stopped and resumed) does not move much.
        on_cpu = [e for e in seeds if not device_label(e)] or seeds
        minutes = seeds[0]["epochs"] * statistics.median(e["epoch_time_median_s"] for e in on_cpu) / 60
        lines.append(
            f"| {label} | {change} | {LABELS[control.compared_with] if control else '-'} | {len(seeds)} | "
            + " | ".join(spread(v) for v in own)
            + f" | {per_seed} | {compared} | {gap} | {minutes:.0f} min |"
        )
    missing = [CONTROLS[n].label for n in CONTROLS if n not in found]
    if len(lines) == 2:
        lines = []
    if missing:
        lines += [*([""] if lines else []), f"Not run yet: {'; '.join(missing)}."]
    return "\n".join(lines)


def points(values: list[float] | None) -> str:
    """``41.00 ± 1.00 (3)`` over fine-tune seeds (AP points), ``41.00 (1)`` for one, ``-`` for none."""
    if not values:
        return "-"
    mean, sd = mean_sd([float(v) for v in values])
    return f"{mean:.2f} ({len(values)})" if sd is None else f"{mean:.2f} ± {sd:.2f} ({len(values)})"


def render_transfer(cards: Path = REPO / "model_cards") -> str:
    rows = sorted(tier_rows(cards), key=lambda r: -mean_sd(seed_values(r, "knn_k200_top1"))[0])
    lines = [
        "| method | checkpoint | CIFAR-10 linear (fast) | BCCD AP | BCCD AP50 | BCCD VOC07 AP50 |",
        "|---|---|---|---|---|---|",
    ]
    def cells(transfer: dict, suffix: str, arch: str) -> str:
        probe = (transfer.get(f"cifar10_linear{suffix}") or {}).get("linear_fast_top1")
        det = transfer.get(f"bccd_detection{suffix}") or {}
        if arch != "resnet18":
            return f"{pct(probe)} | not a ResNet | - | -"
        return f"{pct(probe)} | {points(det.get('AP'))} | {points(det.get('AP50'))} | {points(det.get('voc_AP50'))}"

    baselines: dict[str, dict] = {}
    detectron2_rows = []
    for r in rows:
        transfer = r.get("transfer") or {}
        lines.append(f"| {LABELS[r['method']]} | `{r['name']}` | {cells(transfer, '', r['arch'])} |")
        if any(k.endswith("_random_init") for k in transfer):
            baselines.setdefault(r["arch"], transfer)
        d2 = transfer.get("bccd_detection_detectron2")
        if d2:
            detectron2_rows.append(f"| {LABELS[r['method']]}, detectron2 engine | `{r['name']}` | - | - | - | "
                                   f"{points(d2.get('voc_AP50'))} |")
    lines += detectron2_rows
    for arch, transfer in baselines.items():
        lines.append(f"| random init | `{arch}` | {cells(transfer, '_random_init', arch)} |")
        d2 = transfer.get("bccd_detection_detectron2_random_init")
        if d2:
            lines.append(f"| random init, detectron2 engine | `{arch}` | - | - | - | {points(d2.get('voc_AP50'))} |")
    if any(r["arch"] != "resnet18" for r in rows):
        lines += ["", "CMC's backbone is the L/ab pair (`cmc_resnet18_lab`): not a ResNet the Faster R-CNN engines can hold, "
                      "so it has no detection row."]
    if detectron2_rows:
        lines += ["", "A detectron2 engine row is the same weights exported with `cl-zoo export detectron2` and fine-tuned by "
                      "`cl-zoo detect --engine detectron2` (the bundled R18-FPN config, the same schedule, float32, the config's "
                      "precise BN; `tier_transfer.py detection METHOD --engine detectron2`); detectron2's PASCAL evaluator gives "
                      "VOC07 AP50 only, and the two engines' anchors, samplers and heads differ in detail, so read it as \"the "
                      "exported weights train there\", not as a tie-breaker between engines."]
    return "\n".join(lines)


def pooled_sd(a: list[float], b: list[float]) -> float | None:
    """Pooled sample sd of two groups; None without a degree of freedom (one seed on each side)."""
    dof = len(a) + len(b) - 2
    if dof < 1:
        return None
    squares = sum((v - mean_sd(g)[0]) ** 2 for g in (a, b) for v in g)
    return (squares / dof) ** 0.5


def claim_values(rows: dict[str, dict], controls: dict[str, list[dict]], row: str, metric: str) -> list[float]:
    """Every seed's score of a claim's row: a tier method (``rows``) or ``control:NAME`` (``controls``)."""
    if row.startswith("control:"):
        seeds = controls.get(row.removeprefix("control:"), [])
        return [float(e["fp16_top1"][metric]) for e in seeds if e["fp16_top1"].get(metric) is not None]
    return seed_values(rows[row], metric) if row in rows else []


def verdict(a: list[float], b: list[float]) -> tuple[str, str, str]:
    """(gap, 2 x pooled sd, whether the gap clears it) in points."""
    if not a or not b:
        return "-", "-", "not run yet"
    gap = 100 * (mean_sd(a)[0] - mean_sd(b)[0])
    sd = pooled_sd(a, b)
    if sd is None:
        return f"{gap:+.2f}", "-", "no spread yet (one seed each)"
    clears = abs(gap) > 2 * 100 * sd
    return f"{gap:+.2f}", f"{2 * 100 * sd:.2f}", ("**yes**" if clears else "no")


def render_claims(cards: Path = REPO / "model_cards") -> str:
    lines = [
        "| claim | seeds (A / B) | kNN k=200 gap A - B | 2 x pooled sd | clears? | linear gap | 2 x pooled sd | clears? |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows, controls = {r["method"]: r for r in tier_rows(cards)}, control_rows(cards)
    for claim, a, b in CLAIMS:
        knn = [claim_values(rows, controls, r, "knn_k200_top1") for r in (a, b)]
        linear = [claim_values(rows, controls, r, "linear_fast_top1") for r in (a, b)]
        lines.append(f"| {claim} | {len(knn[0])} / {len(knn[1])} | " + " | ".join(verdict(*knn)) + " | "
                     + " | ".join(verdict(*linear)) + " |")
    return "\n".join(lines)


def replace_block(readme: str, table: str, begin: str = BEGIN, end: str = END) -> str:
    head, sep, rest = readme.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not sep or not sep2:
        raise SystemExit(f"error: {DOC.relative_to(REPO)} has no {begin} ... {end} block")
    return f"{head}{begin}\n{table}\n{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="update docs/cpu-tier.md in place")
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/cpu-tier.md's tables are stale")
    args = parser.parse_args(argv)
    table, controls, transfer = render(), render_controls(), render_transfer()
    readme_path = DOC
    readme = readme_path.read_text(encoding="utf-8")
    updated = replace_block(replace_block(readme, table), controls, CONTROLS_BEGIN, CONTROLS_END)
    updated = replace_block(updated, transfer, TRANSFER_BEGIN, TRANSFER_END)
    claims = render_claims()
    updated = replace_block(updated, claims, CLAIMS_BEGIN, CLAIMS_END)
    if args.check:
        if updated != readme:
            print("error: docs/cpu-tier.md's CPU-tier tables are stale: run python scripts/cpu_tier_table.py --write", file=sys.stderr)
            return 1
        return 0
    if args.write:
        readme_path.write_text(updated, encoding="utf-8")
    print(f"{table}\n\n{controls}\n\n{transfer}\n\n{claims}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
