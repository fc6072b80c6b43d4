"""PNG plots of a bench run's results.json (matplotlib, no display needed)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _errorbars(summary: dict) -> tuple[float, float]:
    """Median and half the interquartile range, for error bars."""
    return summary["median"], summary["iqr"] / 2


def a1_busbw(results: dict, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    by_variant: dict[str, list[tuple[int, dict]]] = {}
    for key, summary in results["benchmarks"]["A1"].items():
        variant, size = key.rsplit("@", 1)
        by_variant.setdefault(variant, []).append((int(size), summary))
    for variant, points in sorted(by_variant.items()):
        points.sort()
        sizes = [s for s, _ in points]
        values = [_errorbars(m) for _, m in points]
        label = "memcpy (algbw, ceiling)" if variant == "memcpy" else variant
        ax.errorbar(sizes, [v for v, _ in values], yerr=[e for _, e in values], marker="o", capsize=3, label=label,
                    linestyle="--" if variant == "memcpy" else "-")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("A1: allreduce, 2 ranks, float32 sum (median, IQR)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def bars(results: dict, benchmark: str, title: str, ylabel: str, path: Path) -> Path:
    data = results["benchmarks"][benchmark]
    names = sorted(data)
    values = [_errorbars(data[n]) for n in names]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(names, [v for v, _ in values], yerr=[e for _, e in values], capsize=4, color="tab:blue")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, path)


def a7_projection(results: dict, path: Path) -> Path:
    a7 = results["a7_model"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label, style in (("projection_paper_link", "25 Gb/s link (Horovod paper)", "-"),
                              ("projection_fitted_link", "link fitted to A1 (loopback)", ":")):
        rows = a7[key]
        if not rows:
            continue
        gpus = [r["gpus"] for r in rows]
        ax.plot(gpus, [r["ring_efficiency"] for r in rows], style, marker="o", label=f"ring allreduce, {label}")
        ax.plot(gpus, [r["ps_efficiency"] for r in rows], style, marker="s", label=f"parameter server, {label}")
    paper = {int(k): v for k, v in a7["paper_efficiency"].items()}
    ax.scatter(list(paper), list(paper.values()), marker="*", s=160, color="black", zorder=5,
               label="Horovod paper, measured")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("scaling efficiency")
    ax.set_title("A7: projected efficiency, ResNet-101 gradients (alpha-beta model)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_all(results: dict, out: Path) -> list[Path]:
    """Every plot the run has data for; returns their paths."""
    done = []
    benchmarks = results["benchmarks"]
    if "A1" in benchmarks:
        done.append(a1_busbw(results, out / "a1_allreduce_busbw.png"))
    specs = {"A2": ("A2: one step of 200 x 64 KB allreduces", "seconds per step"),
             "A3": ("A3: training images/s, variant@ranks", "images per second"),
             "A4": ("A4: train start -> user script's first line", "seconds"),
             "A5": ("A5: start -> every rank past a barrier", "seconds"),
             "A6": ("A6: TF parameter server vs Horovod, 2 hosts", "images per second"),
             "A8": ("A8: built-in trainer vs bare loop, variant@case, 1 process", "training images per second")}
    for benchmark, (title, ylabel) in specs.items():
        if benchmark in benchmarks:
            done.append(bars(results, benchmark, title, ylabel, out / f"{benchmark.lower()}.png"))
    done.append(a7_projection(results, out / "a7_projection.png"))
    return done
