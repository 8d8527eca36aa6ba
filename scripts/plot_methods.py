"""The README's figure of the eight methods, drawn from the published folders so it cannot drift from them.

    python scripts/plot_methods.py                      # writes docs/figures/methods.png
    python scripts/plot_methods.py --out /tmp/m.png     # elsewhere

Every number is read from ``model_cards/<method>_resnet18.imagenette64_cpu/config.json`` through
scripts/cpu_tier_table.py's own readers (``tier_rows``, ``seed_values``, ``mean_sd``), so the bars are
the README table's means and sample sds (n - 1) over seeds. Panels: Imagenette kNN k=200 top-1, the
fast linear probe (L-BFGS on frozen features), and BCCD detection AP (fine-tune seeds) where a card
has it. Each architecture's random init (``random_init_top1``, ``cpu_tier.transfer.*_random_init``)
is drawn as a dashed line over the bars it is read against.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from cpu_tier_table import LABELS, mean_sd, seed_values, tier_rows  # noqa: E402

OUT = REPO / "docs" / "figures" / "methods.png"
BAR = "tab:blue"
BASELINE = "0.35"
PANELS = (  # (key, panel title, x label)
    ("knn_k200_top1", "Imagenette kNN (k=200)", "top-1 accuracy (%)"),
    ("linear_fast_top1", "Imagenette linear probe (fast, L-BFGS)", "top-1 accuracy (%)"),
    ("bccd_AP", "BCCD detection, Faster R-CNN FPN", "COCO AP"),
)
ARCH_LABEL = {"resnet18": "ResNet-18", "cmc_resnet18_lab": "CMC's L/ab pair"}


def panel_values(row: dict, key: str) -> list[float]:
    """A row's per-seed values for one panel, in the panel's unit (percent or AP points); [] if absent."""
    if key == "bccd_AP":
        return [float(v) for v in ((row.get("transfer") or {}).get("bccd_detection") or {}).get("AP") or []]
    return [100 * v for v in seed_values(row, key)]


def baseline_value(row: dict, key: str) -> float | None:
    """The random init of the row's architecture for one panel (same unit), or None where not measured."""
    if key == "bccd_AP":
        values = ((row.get("transfer") or {}).get("bccd_detection_random_init") or {}).get("AP")
        return mean_sd([float(v) for v in values])[0] if values else None
    value = (row.get("random_init_top1") or {}).get(key)
    return None if value is None else 100 * float(value)


def span(values: list[int]) -> str:
    """``30`` when every card agrees, ``20-30`` when they do not (the title must not claim one value)."""
    return str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"


def protocol(rows: list[dict]) -> str:
    """The figure's title: what was trained, how long, over how many seeds, from the cards themselves."""
    epochs = sorted({int(r["epochs"]) for r in rows})
    seeds = sorted({len(seed_values(r, "knn_k200_top1")) for r in rows})
    return (f"{len(rows)} contrastive methods: ResNet-18 pretrained on Imagenette at 64 px, {span(epochs)} epochs, "
            f"{span(seeds)} seeds (bars: mean ± sd over seeds)")


def methods_figure(cards: Path = REPO / "model_cards") -> Any:
    """The bar chart as a matplotlib figure (one axes per panel); the rows are ordered by mean kNN k=200."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(tier_rows(cards), key=lambda r: -mean_sd(seed_values(r, "knn_k200_top1"))[0])
    if not rows:
        raise SystemExit(f"error: no CPU-tier cards under {cards}")
    panels = [p for p in PANELS if any(panel_values(r, p[0]) for r in rows)]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels) + 0.9, 0.36 * len(rows) + 1.5), sharey=True)
    axes = list(axes) if len(panels) > 1 else [axes]
    ys = list(range(len(rows)))[::-1]  # best method on top
    for ax, (key, title, xlabel) in zip(axes, panels):
        for y, row in zip(ys, rows):
            values = panel_values(row, key)
            if values:
                mean, sd = mean_sd(values)
                ax.barh(y, mean, xerr=sd or 0, height=0.65, color=BAR, ecolor="black", capsize=2.5, error_kw={"linewidth": 0.8})
                ax.annotate(f"{mean:.1f}", (mean + (sd or 0), y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
            else:
                ax.text(0.02, y, "n/a (not a ResNet)" if row["arch"] != "resnet18" else "not run", va="center",
                        fontsize=7, color="0.4", transform=ax.get_yaxis_transform())
        for arch in dict.fromkeys(r["arch"] for r in rows):  # one dashed line per architecture, over its rows
            mine = [(y, r) for y, r in zip(ys, rows) if r["arch"] == arch]
            base = next((b for _, r in mine if (b := baseline_value(r, key)) is not None), None)
            if base is None:
                continue
            label = f"random init ({ARCH_LABEL.get(arch, arch)})"
            if len(mine) == len(rows):
                ax.axvline(base, color=BASELINE, linestyle="--", linewidth=1.2, label=label)
            else:
                for y, _ in mine:
                    ax.vlines(base, y - 0.45, y + 0.45, color=BASELINE if arch == "resnet18" else "tab:red",
                              linestyle="--", linewidth=1.2, label=label if y == mine[0][0] else None)
        lows = [b for r in rows if (b := baseline_value(r, key)) is not None]
        lows += [mean_sd(v)[0] - (mean_sd(v)[1] or 0) for r in rows if (v := panel_values(r, key))]
        highs = [mean_sd(v)[0] + (mean_sd(v)[1] or 0) for r in rows if (v := panel_values(r, key))]
        left = max(0, 5 * int(min(lows) // 5) - 5)
        ax.set_xlim(left, max(highs) + 0.14 * (max(highs) - left))  # room for the value labels
        if key == "bccd_AP":  # its spread is over fine-tunes of the one published checkpoint, not pretraining seeds
            counts = sorted({len(v) for r in rows if (v := panel_values(r, key))})
            title += f"\n({span(counts)} fine-tune seeds)"
        ax.set_title(title, fontsize=9.5)
        ax.set_xlabel(xlabel, fontsize=8.5)
        ax.tick_params(labelsize=8)
        ax.grid(axis="x", alpha=0.3)
        ax.set_axisbelow(True)
    axes[0].set_yticks(ys, labels=[LABELS[r["method"]] for r in rows])
    handles: dict[str, Any] = {}  # one legend entry per label across the panels
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=len(handles), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, -0.01))
    fig.suptitle(protocol(rows), fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cards", type=Path, default=REPO / "model_cards", help="folder of the published card folders")
    parser.add_argument("--out", type=Path, default=OUT, help=f"PNG to write (default {OUT.relative_to(REPO)})")
    args = parser.parse_args(argv)
    from cl_zoo.eval.plots import save_figure

    args.out.parent.mkdir(parents=True, exist_ok=True)
    path = save_figure(methods_figure(args.cards), args.out)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
