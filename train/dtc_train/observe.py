"""What a built-in trainer tells the people watching it: the metric line per epoch, progress
lines within an epoch, TensorBoard event files, and an end-of-training report.

One ``Observer`` per process; only the reporting rank's (rank 0, the chief) writes anything,
the others' calls cost nothing, so every trainer calls it the same way:

    observer = Observer(args, rank, world_size=size, steps_per_epoch=steps,
                        global_batch=args.batch_size * size, strategy="horovod")
    for epoch in ...:
        observer.begin_epoch(epoch)
        for step in ...: ...; observer.step_done()
        observer.end_training_steps()          # validation follows
        observer.end_epoch(epoch, train_loss=..., train_accuracy=..., val_loss=...,
                           val_accuracy=..., val_samples=...)
    observer.close()

Outputs (SageMaker uploads both: ``TensorBoardOutputConfig`` syncs ``/opt/ml/output/tensorboard``
to S3 while the job runs, and ``/opt/ml/output/data`` becomes ``output.tar.gz``):

- ``--tensorboard-dir`` (default ``$SM_OUTPUT_DIR/tensorboard``, ``/opt/ml/output/tensorboard``):
  scalars per epoch, written with TensorBoard's own writer (``tensorboard.summary.Writer``):
  ``train/loss``, ``train/accuracy``, ``validation/loss``, ``validation/accuracy``,
  ``throughput/samples_per_second`` (global, training steps only), ``time/epoch_seconds``; the step
  is the epoch number.
  System metrics of the reporting rank's host every ``--system-metrics-seconds`` (default 10; 0
  turns them off; dtc_train.system_metrics): ``system/cpu_percent``, ``system/memory_used_gb``,
  ``system/memory_percent``, ``system/network_sent_mb_per_s``, ``system/network_received_mb_per_s``
  and, where ``nvidia-smi`` runs, ``system/gpu<i>_utilization_percent`` and
  ``system/gpu<i>_memory_used_gb``; their step is seconds since the trainer started sampling.
- ``--report-dir`` (default ``$SM_OUTPUT_DATA_DIR/report``, ``/opt/ml/output/data/report``):
  ``loss.png``, ``accuracy.png``, ``throughput.png`` (matplotlib, per epoch), ``system.png`` (the
  system metrics over time), ``summary.json`` and ``summary.md`` (final metrics; wall time per
  phase: setup = process start to the first epoch, training steps, validation, and the rest of
  each epoch (checkpoint, logging); gradient communication is not listed apart: Horovod and DDP
  overlap it with the backward pass; the system metrics' mean and maximum).

Progress lines, at most one per ``--progress-seconds`` (default 30; 0 turns them off), e.g.
``progress epoch=3/12 step=40/56 samples_per_second=812.4 eta_seconds=95``, where the rate is
the global one over the steps since the previous line and the ETA covers every step left in
the job (validation not included).
"""

from __future__ import annotations

import json
import os
import sys
import time
import types

import psutil

from . import common, contract, fault, system_metrics

PROGRESS_LINE = ("progress epoch={epoch}/{epochs} step={step}/{steps} samples_per_second={rate:.1f} "
                 "eta_seconds={eta:.0f}")
SCALARS = {"train_loss": "train/loss", "train_accuracy": "train/accuracy", "val_loss": "validation/loss",
           "val_accuracy": "validation/accuracy", "samples_per_second": "throughput/samples_per_second",
           "epoch_seconds": "time/epoch_seconds"}


def _event_writer(directory: str):
    """TensorBoard's own writer (``tensorboard.summary.Writer``) of event files in ``directory``,
    without importing TensorFlow into a process that has not imported it.

    The writer reaches the file system through ``tensorboard.compat.tf``, which is all of
    TensorFlow wherever TensorFlow is installed, unless a module ``tensorboard.compat.notf`` can be
    imported: TensorBoard's switch to its own stub of that API (tensorflow/tensorboard,
    ``tensorboard/compat/__init__.py``, its ``no_tensorflow`` target), whose ``gfile`` writes local
    paths. The image holds both frameworks, so before this every PyTorch job's rank 0 imported
    TensorFlow on its way to the first epoch: 4.3 s and 675 MB more, measured on 2026-12-02 on
    this project's 2-core machine beside a test run, while the other ranks waited in their first
    collective (docs/performance.md). A TensorFlow trainer has imported TensorFlow already and
    keeps its ``tf.io.gfile``.
    """
    if "tensorflow" not in sys.modules:
        sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    from tensorboard.summary import Writer  # noqa: PLC0415  (only the reporting rank writes)

    return Writer(directory)


class Observer:
    """Rank 0's metric lines, progress lines, TensorBoard scalars and report; a no-op elsewhere.

    Args:
        args: the parsed hyperparameters (``epochs``, ``tensorboard_dir``, ``report_dir``,
            ``progress_seconds``, ``system_metrics_seconds``; a ``dtc_train.config.TrainerConfig``).
        rank: this process's global rank; rank 0 (the chief) writes. A fault that ``DTC_FAULT``
            asks of this rank (dtc_train.fault) strikes after its step.
        world_size: processes training together (for the summary).
        steps_per_epoch: optimizer steps per epoch, equal on every rank.
        global_batch: samples per step over all ranks (per-rank batch x gradient accumulation steps x
            world size).
        strategy: a name for the summary (``horovod``, ``ddp``, ``multi_worker_mirrored``, ``ps``).
    """

    def __init__(self, args, rank: int, world_size: int, steps_per_epoch: int, global_batch: int,
                 strategy: str):
        reporting = rank == 0
        self.args, self.reporting, self.world_size = args, reporting, world_size
        self.fault = fault.for_rank(rank, contract.current_host())
        self._global_step = 0
        self.steps_per_epoch, self.global_batch, self.strategy = steps_per_epoch, global_batch, strategy
        self.process_start = psutil.Process().create_time()
        self.history: list[dict] = []
        self.first_epoch_start: float | None = None
        self.writer = None
        self.sampler: system_metrics.SystemSampler | None = None
        self.system_samples: list[system_metrics.Sample] = []
        if reporting:
            os.makedirs(args.tensorboard_dir, exist_ok=True)
            self.writer = _event_writer(args.tensorboard_dir)
            if args.system_metrics_seconds > 0:
                self.sampler = system_metrics.SystemSampler(args.system_metrics_seconds).start()
        self._epoch = self._step = self._first_step = 0
        self._epoch_start = self._steps_end = self._last_line = time.time()
        self._last_line_step = 0

    def begin_epoch(self, epoch: int, first_step: int = 0) -> None:
        """Epoch ``epoch`` (1-based) starts its training steps, after ``first_step`` of them done
        before a restart (a checkpoint taken mid-epoch)."""
        now = time.time()
        if self.first_epoch_start is None:
            self.first_epoch_start = now
        self._epoch, self._step, self._first_step = epoch, first_step, first_step
        self._global_step = (epoch - 1) * self.steps_per_epoch + first_step
        self._epoch_start = self._last_line = now
        self._last_line_step = first_step

    def step_done(self) -> None:
        """One optimizer step finished; prints a progress line when one is due."""
        self._step += 1
        self._global_step += 1
        if self.fault and self._global_step == self.fault.step:
            common.log.warning("%s: %s this rank after step %d (%s)", fault.ENV,
                               "stalling" if self.fault.stall_s is not None else "ending", self._global_step,
                               self.fault.describe())
            self.fault.strike(self._global_step)
        if not self.reporting or self.args.progress_seconds <= 0:
            return
        now = time.time()
        if now - self._last_line < self.args.progress_seconds or self._step >= self.steps_per_epoch:
            return
        rate = (self._step - self._last_line_step) * self.global_batch / max(now - self._last_line, 1e-9)
        steps_left = (self.steps_per_epoch - self._step) + (self.args.epochs - self._epoch) * self.steps_per_epoch
        common.emit(PROGRESS_LINE.format(epoch=self._epoch, epochs=self.args.epochs, step=self._step,
                                         steps=self.steps_per_epoch, rate=rate,
                                         eta=steps_left * self.global_batch / max(rate, 1e-9)))
        self._last_line, self._last_line_step = now, self._step
        if self.sampler:
            self._write_system(self.sampler.drain())
            self.writer.flush()

    def _write_system(self, samples: list[system_metrics.Sample]) -> None:
        """Writes ``samples`` to TensorBoard (step: seconds since sampling began) and keeps them
        for the report. The sampler's thread only samples; this rank's thread writes."""
        for sample in samples:
            for tag, value in sample.scalars().items():
                self.writer.add_scalar(tag, value, step=round(sample.elapsed_s), wall_time=sample.wall_time)
        self.system_samples += samples

    def end_training_steps(self) -> None:
        """The epoch's training steps are done; what follows is validation."""
        self._steps_end = time.time()

    def end_epoch(self, epoch: int, *, train_loss: float, train_accuracy: float, val_loss: float,
                  val_accuracy: float, val_samples: int) -> None:
        """Prints the metric line (common.METRIC_LINE) and records the epoch's scalars. Call after
        validation, before the checkpoint (whose time counts in the next call's "other")."""
        if not self.reporting:
            return
        now = time.time()
        if self._steps_end < self._epoch_start:     # a caller without end_training_steps
            self._steps_end = now
        train_s = self._steps_end - self._epoch_start
        record = {"epoch": epoch, "train_loss": float(train_loss), "train_accuracy": float(train_accuracy),
                  "val_loss": float(val_loss), "val_accuracy": float(val_accuracy), "val_samples": int(val_samples),
                  "epoch_seconds": now - self._epoch_start, "train_seconds": train_s,
                  "validation_seconds": now - self._steps_end,
                  "samples_per_second": (self.steps_per_epoch - self._first_step) * self.global_batch
                  / max(train_s, 1e-9)}
        self.history.append(record)
        common.emit(common.METRIC_LINE.format(epochs=self.args.epochs, **{
            k: record[k] for k in ("epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy",
                                   "val_samples", "epoch_seconds", "samples_per_second")}))
        for key, tag in SCALARS.items():
            self.writer.add_scalar(tag, record[key], step=epoch)
        if self.sampler:
            self._write_system(self.sampler.drain())
        self.writer.flush()

    def close(self) -> str | None:
        """Closes the event file and writes the report. Returns the report directory (rank 0)."""
        if not self.reporting:
            return None
        if self.sampler:
            self._write_system(self.sampler.stop())
        self.writer.close()
        end = time.time()
        summary = self.summary(end)
        directory = self.args.report_dir
        os.makedirs(directory, exist_ok=True)
        common.write_json(os.path.join(directory, "summary.json"), summary)
        common.write_text(os.path.join(directory, "summary.md"), _markdown(summary))
        title = f"{self.strategy}, world size {self.world_size}"
        if self.history:
            _plots(self.history, directory, title)
        if self.system_samples:
            _system_plot(self.system_samples, directory, title)
        common.log.info("report written to %s", directory)
        return directory

    def summary(self, end: float) -> dict:
        """The report's numbers: final metrics and wall seconds per phase."""
        start = self.first_epoch_start if self.first_epoch_start is not None else end
        phases = {
            "setup": start - self.process_start,
            "training_steps": sum(r["train_seconds"] for r in self.history),
            "validation": sum(r["validation_seconds"] for r in self.history),
        }
        phases["other"] = max(0.0, (end - self.process_start) - sum(phases.values()))
        last = self.history[-1] if self.history else {}
        return {
            "strategy": self.strategy, "world_size": self.world_size, "epochs": self.args.epochs,
            "epochs_this_run": [r["epoch"] for r in self.history],
            "global_batch": self.global_batch, "steps_per_epoch": self.steps_per_epoch,
            "final": {k: last[k] for k in ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "val_samples")
                      if k in last},
            "mean_samples_per_second": (sum(r["samples_per_second"] for r in self.history) / len(self.history)
                                        if self.history else None),
            "wall_seconds": end - self.process_start,
            "phase_seconds": phases,
            "epochs_detail": self.history,
            "system": (system_metrics.summarize(self.system_samples, self.sampler.interval_s) if self.sampler
                       else {"samples": 0}),
            "preflight": preflight_summary(os.path.join(contract.output_data_dir(), "preflight.json")),
        }


def preflight_summary(path: str) -> dict | None:
    """What the report keeps of this host's preflight record (``train`` wrote it before the job:
    docs/preflight.md): its mode, verdict and seconds, the all-reduces' figures and every finding
    that did not pass; ``None`` when the preflight was off."""
    try:
        with open(path) as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    host = record.get("summaries", {}).get(record.get("host"), {})
    findings = [*host.get("findings", []), *record.get("job_findings", [])]
    return {"mode": record.get("mode"), "verdict": record.get("verdict"), "seconds": record.get("seconds"),
            "hosts": len(record.get("hosts", [])), "allreduce_hosts": record.get("allreduce") or None,
            "allreduce_host": (host.get("facts") or {}).get("allreduce_host"),
            "not_passed": [f"{f['status']}: {f['message']}" for f in findings if f["status"] != "pass"]}


def _markdown(summary: dict) -> str:
    final = summary["final"]
    lines = [f"# Training report ({summary['strategy']}, world size {summary['world_size']})", ""]
    if final:
        lines += [f"- final validation accuracy {final['val_accuracy']:.4f} on {final['val_samples']} samples, "
                  f"validation loss {final['val_loss']:.4f}",
                  f"- final training accuracy {final['train_accuracy']:.4f}, training loss {final['train_loss']:.4f}",
                  f"- epochs in this run: {len(summary['epochs_this_run'])} of {summary['epochs']}"
                  f" (a resumed job starts after its checkpoint's epoch)",
                  f"- throughput: {summary['mean_samples_per_second']:.1f} samples/s (global, mean over epochs)"]
    lines += ["", "| phase | seconds |", "|---|---|"]
    lines += [f"| {name.replace('_', ' ')} | {seconds:.2f} |" for name, seconds in summary["phase_seconds"].items()]
    lines += [f"| total | {summary['wall_seconds']:.2f} |", "",
              "Gradient communication is not listed apart: it overlaps the backward pass.", ""]
    system = summary["system"]
    if system["samples"]:
        count = f"{system['samples']} sample{'s' if system['samples'] != 1 else ''}"
        lines += [f"System metrics of this host, {count} every {system['interval_s']:g} s:", "",
                  "| metric | mean | max |", "|---|---|---|"]
        lines += [f"| {name} | {values['mean']:.2f} | {values['max']:.2f} |"
                  for name, values in system["series"].items()]
        lines += [""]
    preflight = summary.get("preflight")
    if preflight:
        lines += [f"Preflight ({preflight['mode']}, docs/preflight.md): {preflight['verdict']} in "
                  f"{preflight['seconds']:.1f} s on {preflight['hosts']} host(s).", ""]
        for scope, figures in (("the hosts", preflight["allreduce_hosts"]), ("this host's GPUs",
                                                                             preflight["allreduce_host"])):
            if figures and "busbw_gbps" in figures:
                lines += [f"- all-reduce over {scope}: {figures['size_mb']:g} MB, algbw {figures['algbw_gbps']:.2f} "
                          f"GB/s, busbw {figures['busbw_gbps']:.2f} GB/s"]
        lines += [f"- {line}" for line in preflight["not_passed"]] + [""]
    lines += [f"Plots: loss.png, accuracy.png, throughput.png{', system.png' if system['samples'] else ''}.", ""]
    return "\n".join(lines)


def _plots(history: list[dict], directory: str, title: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    epochs = [r["epoch"] for r in history]
    figures = {
        "loss.png": ("loss", [("train_loss", "training"), ("val_loss", "validation")]),
        "accuracy.png": ("accuracy", [("train_accuracy", "training"), ("val_accuracy", "validation")]),
        "throughput.png": ("samples / s (global, training steps)", [("samples_per_second", "throughput")]),
    }
    for name, (ylabel, series) in figures.items():
        figure, axes = plt.subplots(figsize=(6, 4), dpi=100)
        for key, label in series:
            axes.plot(epochs, [r[key] for r in history], marker="o", label=label)
        axes.set_title(title)
        axes.set_xlabel("epoch")
        axes.set_ylabel(ylabel)
        axes.grid(alpha=0.3)
        axes.legend()
        figure.tight_layout()
        common.atomic_write(os.path.join(directory, name), lambda tmp, figure=figure: figure.savefig(tmp, format="png"))
        plt.close(figure)


def _system_plot(samples: list[system_metrics.Sample], directory: str, title: str) -> None:
    """``system.png``: CPU and GPU utilization (%), memory (GB) and network (MB/s) against seconds."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    seconds = [sample.elapsed_s for sample in samples]
    scalars = [sample.scalars() for sample in samples]
    panels = (("utilization (%)", "_percent"), ("memory (GB)", "_gb"), ("network (MB/s)", "_mb_per_s"))
    figure, axes = plt.subplots(len(panels), 1, figsize=(6, 8), dpi=100, sharex=True)
    for axis, (ylabel, suffix) in zip(axes, panels, strict=True):
        for tag in sorted({tag for values in scalars for tag in values if tag.endswith(suffix)}):
            axis.plot(seconds, [values.get(tag, float("nan")) for values in scalars], marker=".",
                      label=tag.removeprefix("system/"))
        axis.set_ylabel(ylabel)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    axes[0].set_title(f"system metrics of this host ({title})")
    axes[-1].set_xlabel("seconds since sampling began")
    figure.tight_layout()
    common.atomic_write(os.path.join(directory, "system.png"), lambda tmp: figure.savefig(tmp, format="png"))
    plt.close(figure)
