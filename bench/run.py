"""``make bench``: runs the CPU benchmark suite in the image (``--host``: in this host's virtual
environment instead), the two-host A6
comparison in a local cluster, fits A7's model, and writes ``build/bench/<UTC time>/``: ``results.json`` (machine,
load, pinning, versions, every repeat, medians and IQRs, ratios against the baselines measured
in the same run, targets), ``records.jsonl`` (raw), PNG plots, and prints the ratio table.
``build/bench/latest`` points at the newest run.

``--quick`` (``make bench QUICK=1``): A1, A2, A4, A5 and A8 at tiny sizes and one repeat
(A8: the digits case over 2 epochs), no A3 or A6: checks the harness in a few minutes; its
numbers mean nothing.

``--gpu`` (``make bench-gpu``): the GPU suite B1-B5 (bench/gpu/suite.py) in the GPU image with
every GPU passed in, and a dated ``report.md``; on a machine without an NVIDIA GPU it writes a
report saying so and exits 0.

Targets (issue #11): A1 Horovod >= 0.9x the best baseline's busbw at >= 8 MB; A2 fusion on >= 1.3x
faster than off (with the Gloo controller, over TCP as between hosts; with MPI on one host, shared
memory makes each small message cheap and fusion is reported only); A3 Horovod >= DDP; A4 ours <=
0.15x the stock toolkit and <= 0.3 s; A5 our overhead on top of the bare launcher (mpirun, torchrun)
<= 10 %; for a single process, whose bare launch is the interpreter alone, the overhead is reported
in seconds; A8 (issue #19) the built-in PyTorch trainer's training images/s >= 0.97x a bare loop's
on the same model and data (bench/trainer_overhead.py). A6 and A7 are reported.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402
import model  # noqa: E402
import plots  # noqa: E402

BIG_BYTES = 8 << 20
EPOCH = re.compile(r"epoch=(\d+)/\d+ .*?epoch_seconds=([0-9.]+)")


def container(*argv: str, timeout_s: float = 7200) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "scripts" / "container.sh"), *argv], text=True, timeout=timeout_s)


def run_suite(image: str | None, out: Path, quick: bool, only: str, repeats: int) -> None:
    """The suite in ``image`` (algo-1 resolves to loopback there, as the stock toolkit of A4
    needs), or with this process's Python (the host's virtual environment, its bin first on PATH
    for the trainers' `train`) when ``image`` is None."""
    flags = ["--only", only, "--repeats", str(repeats)] + (["--quick"] if quick else [])
    if image is None:
        venv_bin = Path(sys.executable).parent
        done = subprocess.run([sys.executable, str(HERE / "suite.py"), "--out", str(out), *flags], text=True,
                              env={**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ['PATH']}"})
    else:
        done = container("run", "--rm", "--shm-size", "1g", "--hostname", "algo-1", "--add-host", "algo-1:127.0.0.1",
                         "-v", f"{HERE}:/bench:ro", "-v", f"{out}:/out", image, "python", "/bench/suite.py", "--out",
                         "/out", *flags)
    if done.returncode != 0:
        raise SystemExit("bench: the suite failed (output above)")


def run_a6(image: str, out: Path, epochs: int = 4) -> list[dict]:
    """A6: TF parameter server (chief + 1 worker + 2 ps) vs Horovod allreduce (2 x 1 rank), same model
    and per-worker batch, 2 hosts of a local cluster: training images/s over epochs 2..epochs."""
    rows = []
    for variant, distribution in (("parameter-server", "parameter_server"), ("horovod-allreduce", "mpi")):
        job = out / f"a6-{variant}"
        done = subprocess.run([sys.executable, "-m", "dtc_local.cluster", "--image", image, "--instance-count", "2",
                               "--distribution", distribution, "--processes-per-host", "1", "--program",
                               "builtin:tensorflow", "--job-dir", str(job), "-p", f"epochs={epochs}"],
                              capture_output=True, text=True, timeout=1800, env=podman_env())
        seconds = sorted(float(s) for e, s in EPOCH.findall(done.stdout) if int(e) > 1)
        if done.returncode != 0 or not seconds:
            raise SystemExit(f"bench: A6 {variant} failed:\n{done.stdout[-3000:]}")
        rows.append({"benchmark": "A6", "variant": variant, "hosts": 2, "repeat": 0,
                     "images_per_s": 1437 / seconds[len(seconds) // 2]})
    return rows


def podman_env() -> dict:
    conf = subprocess.run(["bash", "-c", f". {REPO / 'scripts' / 'podman-env.sh'} && echo $CONTAINERS_CONF"],
                          capture_output=True, text=True, check=True).stdout.strip()
    return {**os.environ, "CONTAINERS_CONF": conf}


def medians(records: list[dict], benchmark: str, value: str, *keys: str) -> dict[tuple, dict]:
    """(variant, *keys) -> summary of ``value`` over the repeats."""
    groups: dict[tuple, list[float]] = {}
    for r in records:
        if r["benchmark"] == benchmark and value in r:
            groups.setdefault((r["variant"], *(r[k] for k in keys)), []).append(r[value])
    return {k: common.summary(v) for k, v in groups.items()}


def analyse(records: list[dict]) -> tuple[dict, list[dict]]:
    """Summaries per benchmark, and the ratio rows (measured ratio, target, met)."""
    summaries, ratios = {}, []

    def ratio(benchmark, what, value, target, higher_is_better=True):
        met = None if target is None else (value >= target if higher_is_better else value <= target)
        ratios.append({"benchmark": benchmark, "measurement": what, "value": value, "target": target, "met": met})

    a1 = medians(records, "A1", "busbw_gbps", "size_bytes")
    memcpy = medians(records, "A1", "algbw_gbps", "size_bytes")
    if a1:
        summaries["A1"] = {f"{v}@{s}": m for (v, s), m in {**a1, **{k: v for k, v in memcpy.items()
                                                                      if k[0] == "memcpy"}}.items()}
        sizes = sorted({s for _, s in a1})
        for size in [s for s in sizes if s >= BIG_BYTES] or sizes[-1:]:
            best = max(a1[(b, size)]["median"] for b in ("torch-gloo", "mpi4py") if (b, size) in a1)
            for horovod in ("horovod-mpi", "horovod-mpi-cycle-0.1ms", "horovod-gloo"):
                if (horovod, size) in a1:
                    ratio("A1", f"{horovod} busbw / best baseline @ {size >> 10} KB",
                          a1[(horovod, size)]["median"] / best,
                          0.9 if size >= BIG_BYTES else None)
            if ("memcpy", size) in memcpy:
                ratio("A1", f"best allreduce busbw / memcpy bandwidth @ {size >> 10} KB",
                      max(a1[(v, size)]["median"] for v, s in a1 if s == size)
                      / memcpy[("memcpy", size)]["median"], None)
    a2 = medians(records, "A2", "time_s")
    if a2:
        summaries["A2"] = {v: m for (v,), m in a2.items()}
        ratio("A2", "Horovod step, Gloo (TCP): fusion off / fusion on (speed-up)",
              a2[("horovod-gloo-fusion-off",)]["median"] / a2[("horovod-gloo-fusion-on",)]["median"], 1.3)
        ratio("A2", "Horovod step, MPI (shared memory): fusion off / fusion on",
              a2[("horovod-mpi-fusion-off",)]["median"] / a2[("horovod-mpi-fusion-on",)]["median"], None)
        ratio("A2", "DDP step: 1 MB buckets / 25 MB buckets",
              a2[("ddp-bucket-1mb",)]["median"] / a2[("ddp-bucket-25mb",)]["median"], None)
    a3 = medians(records, "A3", "images_per_s", "ranks")
    if a3:
        summaries["A3"] = {f"{v}@{n}": m for (v, n), m in a3.items()}
        for case in sorted({v for v, _ in a3}):
            ratio("A3", f"{case} weak-scaling efficiency 1 -> 2 ranks",
                  a3[(case, 2)]["median"] / (2 * a3[(case, 1)]["median"]), None)
        ratio("A3", "Horovod / DDP images/s, PyTorch, 2 ranks",
              a3[("horovod-pytorch", 2)]["median"] / a3[("ddp-pytorch", 2)]["median"], 1.0)
        ratio("A3", "Horovod PyTorch images/s, 2 ranks: waiting ranks yield / spin (mpi_yield_when_idle 1 / 0)",
              a3[("horovod-pytorch", 2)]["median"] / a3[("horovod-pytorch-polling", 2)]["median"], 1.0)
    a4 = medians(records, "A4", "time_s")
    if a4:
        summaries["A4"] = {v: m for (v,), m in a4.items()}
        for mode in ("single", "mpi2"):
            ours, stock = a4[(f"ours-{mode}",)]["median"], a4[(f"stock-{mode}",)]["median"]
            ratio("A4", f"train -> first line, {mode}: ours / stock toolkit", ours / stock, 0.15, False)
            ratio("A4", f"train -> first line, {mode}: ours (s)", ours, 0.3, False)
        if ("ours-single-preflight",) in a4:
            ratio("A4", "train -> first line, single: seconds the preflight (quick, one CPU host) adds",
                  a4[("ours-single-preflight",)]["median"] - a4[("ours-single",)]["median"], None)
    a5 = medians(records, "A5", "time_s")
    if a5:
        summaries["A5"] = {v: m for (v,), m in a5.items()}
        ratio("A5", "start -> past a barrier, single process: ours - bare python (s)",
              a5[("ours-single",)]["median"] - a5[("bare-single",)]["median"], None)
        for launcher in ("mpi", "torchrun"):
            ratio("A5", f"start -> all ranks past a barrier, {launcher}: ours / bare - 1",
                  a5[(f"ours-{launcher}",)]["median"] / a5[(f"bare-{launcher}",)]["median"] - 1, 0.10, False)
    a8 = medians(records, "A8", "images_per_s", "case")
    if a8:
        summaries["A8"] = {f"{v}@{c}": m for (v, c), m in a8.items()}
        for case in sorted({c for _, c in a8}):
            bare = a8[("bare-loop", case)]["median"]
            ratio("A8", f"built-in trainer / bare loop, training images/s, {case}, 1 process",
                  a8[("trainer", case)]["median"] / bare, 0.97)
            if ("trainer-no-stall-rule", case) in a8:   # issue #41: watching for stalls costs within noise
                ratio("A8", f"built-in trainer with / without the stall rule, training images/s, {case}",
                      a8[("trainer", case)]["median"] / a8[("trainer-no-stall-rule", case)]["median"], None)
            for variant, name in (("horovod-1-rank", "Horovod"), ("ddp-1-rank", "DDP")):
                if (variant, case) in a8:
                    ratio("A8", f"{name} trainer on 1 rank / bare loop, training images/s, {case}",
                          a8[(variant, case)]["median"] / bare, None)
            if ("bare-loop-ddp", case) in a8:   # DDP's own cost, and the DDP trainer's apart from it
                bare_ddp = a8[("bare-loop-ddp", case)]["median"]
                ratio("A8", f"bare loop in DDP (group of 1) / bare loop, training images/s, {case}",
                      bare_ddp / bare, None)
                if ("ddp-1-rank", case) in a8:
                    ratio("A8", f"DDP trainer on 1 rank / bare loop in DDP, training images/s, {case}",
                          a8[("ddp-1-rank", case)]["median"] / bare_ddp, None)
    a6 = medians(records, "A6", "images_per_s")
    if a6:
        summaries["A6"] = {v: m for (v,), m in a6.items()}
        ratio("A6", "PS (1 worker) / Horovod (2 workers) images/s, 2 hosts",
              a6[("parameter-server",)]["median"] / a6[("horovod-allreduce",)]["median"], None)
    return summaries, ratios


def fit_a7(records: list[dict]) -> dict:
    """The alpha-beta fit to A1 (``fitted`` is None, with the reason, when the run's sizes do not
    allow one, as a quick run's may not) and the projections."""
    paper = model.ASSUMPTIONS["paper_link"]
    result = {"assumptions": {k: v for k, v in model.ASSUMPTIONS.items() if k != "paper_efficiency"},
              "paper_efficiency": model.ASSUMPTIONS["paper_efficiency"],
              "projection_paper_link": model.projection(paper["alpha_s"], paper["beta_bytes_per_s"]),
              "fitted": None, "projection_fitted_link": None}
    points = medians(records, "A1", "time_s", "size_bytes")
    sizes = sorted(s for v, s in points if v == "horovod-mpi")
    try:
        alpha, beta = model.fit_alpha_beta(sizes, [points[("horovod-mpi", s)]["median"] for s in sizes])
    except ValueError as error:
        result["fit_error"] = str(error)
        return result
    result["fitted"] = {"alpha_s": alpha, "beta_bytes_per_s": beta, "source": "A1 horovod-mpi medians, 2 ranks"}
    result["projection_fitted_link"] = model.projection(alpha, beta)
    return result


def table(ratios: list[dict]) -> str:
    lines = [f"{'id':<4} {'measurement':<66} {'value':>8} {'target':>8}  met"]
    for r in ratios:
        target = "" if r["target"] is None else f"{r['target']:.2f}"
        met = "" if r["met"] is None else ("yes" if r["met"] else "NO")
        lines.append(f"{r['benchmark']:<4} {r['measurement']:<66} {r['value']:>8.3f} {target:>8}  {met}")
    return "\n".join(lines)


def gpu_devices() -> list[str]:
    """The GPUs ``nvidia-smi -L`` lists (none without the driver)."""
    if shutil.which("nvidia-smi") is None:
        return []
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return [line for line in done.stdout.splitlines() if line.startswith("GPU ")] if done.returncode == 0 else []


def run_gpu(image: str, out: Path, quick: bool) -> None:
    """B1-B5 in the GPU image; writes gpu-results.json and report.md in ``out``."""
    devices = gpu_devices()
    if devices:
        argv = ["run", "--rm", "--all-gpus", "--shm-size", "16g", "-v", f"{HERE}:/bench:ro", "-v", f"{out}:/out", image,
                "python", "/bench/gpu/suite.py", "--out", "/out"] + (["--quick"] if quick else [])
        if container(*argv).returncode != 0:
            raise SystemExit("bench: the GPU suite failed (output above)")
        result = json.loads((out / "gpu-results.json").read_text())
    else:
        result = {"skipped": "no NVIDIA GPU on this machine (nvidia-smi -L lists none)", "machine": common.machine(),
                  "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (out / "gpu-results.json").write_text(json.dumps(result, indent=2))
    lines = [f"# GPU benchmarks, {result['date']}", "", f"- image: {image}",
             f"- machine: {result['machine']['cpu']}, {result['machine']['cores']} cores"]
    if "skipped" in result:
        lines.append(f"- skipped: {result['skipped']}")
    else:
        lines += [f"- GPUs: {', '.join(result['gpus'])}; torch {result['torch']}, CUDA {result['cuda']}", "",
                  "| id | measurement | value | target |", "|---|---|---|---|",
                  f"| B1 | ResNet-50 synthetic, bf16, images/s per GPU | {result['B1']['images_per_s']:.0f} | "
                  f"anchor: {result['anchors']['B1']} |",
                  f"| B2 | DALI real JPEG / synthetic | {result['B2']['dali_vs_synthetic']:.3f} | >= 0.95 |",
                  f"| B2 | DALI, ResNet-50 example's settings / synthetic | "
                  f"{result['B2']['dali_tuned_vs_synthetic']:.3f} | >= 0.95 |",
                  f"| B2 | PyTorch DataLoader + PIL, images/s | {result['B2']['dataloader_images_per_s']:.0f} | |",
                  f"| B3 | Horovod single-rank overhead | {result['B3']['overhead']:.3%} | <= 3 % |"]
        lines += [f"| B4 | NCCL allreduce busbw @ {r['size_bytes'] >> 20} MB, {r['ranks']} GPUs, GB/s | "
                  f"{r['busbw_gbps']:.1f} | |" for r in result["B4"]]
        lines += [f"| B5 | built-in {label} trainer, ResNet-50 bf16, images/s (overhead against a bare loop) | "
                  f"{result['B5'][name]['trainer']['images_per_s']:.0f} ({result['B5'][name]['overhead']:.1%}) | "
                  "<= 3 % |" for name, label in (("single", "no-distribution"), ("horovod", "Horovod"), ("ddp", "DDP"))]
        lines += [f"| B5 | DDP on a group of one / bare loop, ResNet-50 bf16 (DDP's own cost) | "
                  f"{result['B5']['ddp']['ddp_wrapper_overhead']:.1%} | |",
                  f"| B5 | built-in DDP trainer / bare loop in DDP (the trainer's own cost) | "
                  f"{result['B5']['ddp']['overhead_vs_bare_loop_ddp']:.1%} | <= 3 % |"]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default=os.environ.get("IMAGE", "dtc:cpu"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--gpu", action="store_true", help="the GPU suite (B1-B5) instead of the CPU one")
    parser.add_argument("--only", help="comma-separated benchmarks (default: all for the mode)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats of each in-image benchmark (--quick: 1)")
    parser.add_argument("--host", action="store_true",
                        help="run the suite (A1-A5, A8) in this host's virtual environment instead of the image (to "
                             "measure a change without rebuilding the image)")
    parser.add_argument("--out-root", default=str(REPO / "build" / "bench"))
    args = parser.parse_args(argv)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = Path(args.out_root) / (stamp + ("-gpu" if args.gpu else "") + ("-quick" if args.quick else ""))
    out.mkdir(parents=True)
    if args.gpu:
        run_gpu(args.image, out, args.quick)
        return
    only = args.only or ("A1,A2,A4,A5,A8" if args.quick else "A1,A2,A3,A4,A5,A6,A8")
    in_image = ",".join(b for b in only.split(",") if b != "A6")
    run_suite(None if args.host else args.image, out, args.quick, in_image, args.repeats)
    records = common.read_records(str(out / "records.jsonl"))
    if "A6" in only.split(","):
        records += run_a6(args.image, out)
        common.write_records(str(out / "records.jsonl"), [r for r in records if r["benchmark"] == "A6"])
    meta = json.loads((out / "meta.json").read_text())
    summaries, ratios = analyse(records)
    results = {**meta, "image": "the host's virtual environment" if args.host else args.image, "date": stamp,
               "benchmarks": summaries, "ratios": ratios, "a7_model": fit_a7(records), "records": records}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    written = plots.write_all(results, out)
    latest = Path(args.out_root) / "latest"
    latest.unlink(missing_ok=True)
    latest.symlink_to(out.name)
    print(table(ratios))
    flag = " (FLAGGED: the machine was not idle at the start)" if meta["flagged_under_load"] else ""
    print(f"\nCPUs busy at start {meta['cpu_busy_at_start']:.0%}, load {meta['load_at_start']:.2f}{flag}; "
          f"results {out / 'results.json'}; "
          f"plots {', '.join(p.name for p in written)}")


if __name__ == "__main__":
    main()
