"""The built-in trainers' hyperparameters, parsed once into a frozen ``TrainerConfig``.

SageMaker passes each hyperparameter as ``--name value`` (the entrypoint's ``train`` builds that
argv from ``hyperparameters.json``). Every option of every built-in trainer is declared once
here (``OPTIONS``), with the backends it applies to (``BACKENDS``: one per way of training, read
from its record in ``dtc_train.trainers``). A backend parses them all and refuses, before
anything starts, an option that was given but that it does not apply, naming the option, the
backend and the backends that do apply it; it does not silently ignore it (``data-device``
under MultiWorkerMirrored, which reads through ``tf.data``, not DALI). An option it applies but
that was not given keeps its default.

This module imports neither TensorFlow nor PyTorch: the choices they define (precisions,
compressions) are spelled here and the trainers map them.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from . import channel, contract, lr_schedule, plateau, stop, trainers

# the backends: one per way of training, each a record in dtc_train.trainers (its module's name)
PYTORCH_SINGLE = "pytorch_single"
PYTORCH_HOROVOD = "pytorch_horovod"
PYTORCH_DDP = "pytorch_ddp"
TENSORFLOW_HOROVOD = "tensorflow_horovod"
TENSORFLOW_MIRRORED = "tensorflow_mwms"
TENSORFLOW_PS = "tensorflow_ps"

BACKENDS = {name: trainer.describes for name, trainer in trainers.registry().items()}
# the option groups, read from each trainer's record: an option declared for a group applies to a
# new trainer exactly when its record says it belongs there
ALL = frozenset(BACKENDS)                  # the options every trainer applies (epochs, batch size, ...)
PYTORCH = frozenset(name for name, trainer in trainers.registry().items() if trainer.framework == "pytorch")
TENSORFLOW = frozenset(name for name, trainer in trainers.registry().items() if trainer.framework == "tensorflow")
DALI = frozenset(name for name, trainer in trainers.registry().items() if trainer.dali_input)
# every step on every rank: progress within an epoch, a step's loss
SYNCHRONOUS = frozenset(name for name, trainer in trainers.registry().items() if trainer.synchronous)

PRECISIONS = ("fp32", "bf16", "fp16")
COMPRESSIONS = ("none", "fp16")


def bounded(convert: Callable[[str], float], name: str, low: float, below: float | None = None
            ) -> Callable[[str], float]:
    """An argparse ``type``: ``convert(text)`` if it is ``>= low`` (and ``< below``), else
    ``ValueError``, which argparse reports as ``invalid <name> value: '<text>'``."""
    def parse(text: str):
        value = convert(text)
        if value < low or (below is not None and value >= below):
            raise ValueError(text)
        return value

    parse.__name__ = name
    return parse


non_negative = bounded(float, "non_negative", 0)
fraction = bounded(float, "fraction", 0, below=1)
positive_int = bounded(int, "positive_int", 1)
non_negative_int = bounded(int, "non_negative_int", 0)


def positive(text: str) -> float:
    """A float above 0 (argparse: ``invalid positive value: '<text>'`` otherwise)."""
    value = float(text)
    if not value > 0:
        raise ValueError(text)
    return value


def step_range(text: str) -> tuple[int, int]:
    """``A:B`` (``1 <= A <= B``, global optimizer steps) as ``(A, B)``."""
    first, _, last = text.partition(":")
    steps = int(first), int(last or first)
    if not 1 <= steps[0] <= steps[1]:
        raise ValueError(text)   # argparse: "invalid step_range value: ..."
    return steps


def checkpoint_schedule(text: str) -> stop.Schedule:
    """``checkpoint-every`` as a ``stop.Schedule`` (argparse reports its ``ValueError``)."""
    try:
        return stop.Schedule.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


@dataclass(frozen=True)
class Option:
    """One hyperparameter: its flag, the backends that apply it, and ``argparse``'s settings."""

    flag: str
    backends: frozenset[str]
    settings: dict = field(default_factory=dict)

    @property
    def dest(self) -> str:
        return self.settings.get("dest") or self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class Refusal:
    """Hyperparameter values that ``backends`` refuse together, and why: ``values`` holds
    ``(dest, test)`` pairs, a test being the refused value or a predicate on the value."""

    backends: frozenset[str]
    values: tuple[tuple[str, object], ...]
    why: str

    def refuses(self, backend: str, values: dict) -> bool:
        return backend in self.backends and all(
            test(values[dest]) if callable(test) else values[dest] == test for dest, test in self.values)


def _more_than_one(steps: int) -> bool:
    return steps > 1


REFUSALS = (
    Refusal(frozenset({TENSORFLOW_PS}), (("precision", "fp16"),),
            "fp16 needs loss scaling, which Keras' LossScaleOptimizer does not do under ParameterServerStrategy; "
            "use precision=bf16, which needs none"),
    # Horovod's backward_passes_per_step hands Keras' LossScaleOptimizer each rank's own sum
    # between allreduces, whose finiteness differs by rank: the ranks' loss scales would drift
    Refusal(frozenset({TENSORFLOW_HOROVOD}), (("precision", "fp16"), ("gradient_accumulation_steps", _more_than_one)),
            "its loss scaling would judge each rank's gradients between allreduces alone; use precision=bf16 with "
            "accumulation, or fp16 without it"),
    # torch's GradScaler decides on each rank's own gradient shards whether to skip a step
    Refusal(frozenset({PYTORCH_DDP}), (("compile", "on"), ("data_parallel", "fsdp")),
            "torch.compile of an FSDP2 model is not proved in this image; use compile=on with data-parallel=ddp"),
    Refusal(frozenset({PYTORCH_DDP}), (("precision", "fp16"), ("data_parallel", "fsdp")),
            "loss scaling would judge each rank's gradient shard alone; use precision=bf16, which needs no loss "
            "scaling"),
)


def _refusal_message(refusal: Refusal, backend: str, values: dict) -> str:
    said = [f"{dest.replace('_', '-')}={values[dest]}" for dest, _ in refusal.values]
    if len(said) == 1:
        return f"hyperparameter {said[0]} does not apply to {BACKENDS[backend]}: {refusal.why}"
    return f"hyperparameters {' and '.join(said)} do not combine under {BACKENDS[backend]}: {refusal.why}"


def _options() -> tuple[Option, ...]:
    # defaults that come from the SageMaker contract are read when the trainer starts
    output = contract.output_dir()
    return (
        Option("--epochs", ALL, dict(type=positive_int, default=12)),
        Option("--batch-size", ALL, dict(type=positive_int, default=32, help="samples per rank (replica) per step")),
        Option("--learning-rate", ALL, dict(type=positive, default=0.01,
                                            help="per-rank rate; scaled by the world size (dtc_train.lr_schedule)")),
        Option("--momentum", ALL, dict(type=float, default=0.9)),
        Option("--seed", ALL, dict(type=int, default=1)),
        Option("--train-channel", ALL, dict(default="training")),
        Option("--validation-channel", ALL, dict(default="validation")),
        Option("--model-dir", ALL, dict(default=contract.model_dir())),
        Option("--checkpoint-dir", ALL, dict(default=contract.checkpoint_dir())),
        Option("--checkpoint-every", ALL, dict(
            type=checkpoint_schedule, default=stop.Schedule(1, "epochs"),
            help="scheduled checkpoints: every N epochs ('1', '2epochs') or optimizer steps ('500steps'), or 0 for "
                 "none; one is also written when the job is stopped (SIGTERM) and at the end (dtc_train.stop)")),
        Option("--model_dir", ALL, dict(dest="estimator_model_dir", metavar="URI", default=None,
                                        help="accepted because SageMaker's TensorFlow estimator always passes it (an "
                                             "s3:// URI by default); the model is saved to --model-dir")),
        Option("--corrupt-images", ALL, dict(choices=channel.CORRUPT_IMAGES_CHOICES, default="fail",
                                             help="image files Pillow cannot read: fail naming them, skip them, or "
                                                  "off (no check); dtc_train.channel")),
        Option("--tensorboard-dir", ALL, dict(default=os.path.join(output, "tensorboard"),
                                              help="TensorBoard event files (dtc_train.observe)")),
        Option("--report-dir", ALL, dict(default=os.path.join(contract.output_data_dir(), "report"),
                                         help="end-of-training plots and summary (uploaded in output.tar.gz)")),
        Option("--system-metrics-seconds", ALL, dict(
            type=non_negative, default=10.0,
            help="seconds between samples of the host's CPU, memory, network and GPUs; 0: none")),
        Option("--warmup-epochs", ALL, dict(
            type=non_negative, default=0.0,
            help="epochs over which the rate rises linearly from learning-rate to learning-rate x world size "
                 "(gradual warmup, Goyal et al. 2017); 0: none (dtc_train.lr_schedule)")),
        Option("--lr-schedule", ALL, dict(
            choices=lr_schedule.DECAYS, default="constant",
            help="after the warmup: constant, or cosine decay to 0 over the job's steps")),
        Option("--early-stopping-patience", ALL, dict(
            type=non_negative_int, default=0,
            help="stop after this many epochs in a row without a lower validation loss (Keras' EarlyStopping on "
                 "val_loss); 0: never (dtc_train.plateau)")),
        Option("--progress-seconds", SYNCHRONOUS, dict(
            type=non_negative, default=30.0,
            help="at most one progress line per this many seconds within an epoch; 0: none")),
        Option("--nonfinite-loss", SYNCHRONOUS, dict(
            choices=plateau.NONFINITE_LOSS_CHOICES, default="fail",
            help="fail: a NaN or infinite training loss fails the job naming the step; continue: train on")),
        Option("--data-device", DALI, dict(choices=("auto", "cpu", "gpu"), default="auto",
                                           help="where DALI decodes: gpu when one is visible (auto), or forced")),
        Option("--dali-threads", DALI, dict(type=positive_int, default=2)),
        Option("--profile-steps", PYTORCH, dict(
            type=step_range, metavar="A:B", default=None,
            help="rank 0 records a torch.profiler trace of the job's optimizer steps A to B (1-based, counted over "
                 "epochs) into tensorboard-dir")),
        Option("--gradient-accumulation-steps", ALL, dict(
            type=positive_int, default=1,
            help="batches of batch-size per optimizer step, their gradients added up on each rank (replica) and "
                 "averaged over the ranks once per step; 1: none")),
        Option("--precision", ALL, dict(
            choices=PRECISIONS, default="fp32",
            help="fp32; bf16 or fp16: builtin:pytorch runs the forward pass and loss under torch.autocast, "
                 "builtin:tensorflow computes its layers in bf16 or fp16 (Keras' mixed_bfloat16 / mixed_float16 "
                 "policy); fp16 with dynamic loss scaling (not under parameter_server)")),
        Option("--label-smoothing", ALL, dict(
            type=fraction, default=0.0,
            help="training loss against targets of 1 - e on the label and e / classes everywhere; 0: none")),
        Option("--model", ALL, dict(
            default="digits",
            help="digits (the small CNN for 8x8 grayscale images) or a torchvision classification architecture "
                 "(builtin:pytorch: resnet50, mobilenet_v3_large, efficientnet_b0, vit_b_16, ...; "
                 "dtc_train.torch_model) or keras.applications one (builtin:tensorflow: ResNet50, MobileNetV2, "
                 "EfficientNetB0, ...; dtc_train.tf_model)")),
        Option("--image-size", ALL, dict(
            type=positive_int, default=None,
            help="input height and width in pixels (default: 8 for digits, 224 for an architecture)")),
        Option("--augment", ALL, dict(choices=("auto", "on", "off"), default="auto",
                                      help="random resized crop and flip in training (auto: on for an architecture, "
                                           "off for digits)")),
        Option("--pretrained-weights", ALL, dict(
            metavar="CHANNEL[/PATH]", default=None,
            help="start from the weights file in this input channel (its one weights file, or PATH in it): a state "
                 "dict (.pth/.pt/.bin) for builtin:pytorch, Keras HDF5 weights (.h5/.hdf5) for builtin:tensorflow; "
                 "layers that do not fit (a head for another class count) keep their initial values")),
        Option("--allreduce-compression", frozenset({PYTORCH_HOROVOD}), dict(
            choices=COMPRESSIONS, default="none",
            help="fp16: gradients are cast to float16 for the allreduce and back (Horovod's Compression.fp16)")),
        Option("--data-parallel", frozenset({PYTORCH_DDP}), dict(
            choices=("ddp", "fsdp"), default="ddp",
            help="ddp: every rank holds the whole model (DistributedDataParallel); fsdp: model, gradients and "
                 "optimizer state sharded over the ranks (FSDP2 fully_shard)")),
        Option("--compile", frozenset({PYTORCH_SINGLE, PYTORCH_DDP}), dict(
            choices=("off", "on"), default="off",
            help="on: the model runs through torch.compile (TorchInductor's fused kernels; the first steps compile "
                 "for a minute or more, then each step is faster); its weights, checkpoints and model.pth are the "
                 "same as without it")),
        Option("--cpu-replicas", frozenset({TENSORFLOW_MIRRORED}), dict(
            type=positive_int, default=1,
            help="one host without GPUs and no distribution: mirror over this many logical CPU devices")),
    )


@dataclass(frozen=True)
class TrainerConfig:
    """Every built-in trainer's hyperparameters, typed; those its backend does not apply are at
    their defaults (``parse`` refuses them when given). The fields are ``OPTIONS``' ``dest``s.

    Units: ``*_seconds`` in seconds, ``learning_rate`` per rank (``lr_schedule``), ``batch_size``
    samples per rank (a mirrored strategy: per replica) per micro-batch.
    """

    backend: str
    epochs: int
    batch_size: int
    learning_rate: float
    momentum: float
    seed: int
    train_channel: str
    validation_channel: str
    model_dir: str
    checkpoint_dir: str
    checkpoint_every: stop.Schedule
    estimator_model_dir: str | None
    corrupt_images: str
    tensorboard_dir: str
    report_dir: str
    system_metrics_seconds: float
    warmup_epochs: float
    lr_schedule: str
    early_stopping_patience: int
    progress_seconds: float
    nonfinite_loss: str
    data_device: str
    dali_threads: int
    profile_steps: tuple[int, int] | None
    gradient_accumulation_steps: int
    precision: str
    label_smoothing: float
    model: str
    image_size: int | None
    augment: str
    pretrained_weights: str | None
    allreduce_compression: str
    data_parallel: str
    compile: str
    cpu_replicas: int


def _parser(description: str, options: Sequence[Option], given_only: bool) -> argparse.ArgumentParser:
    """Every option; with ``given_only``, none has a default (the result holds what argv gave)."""
    # no abbreviations: a hyperparameter spelled short (epoch) is refused, not taken for another
    parser = argparse.ArgumentParser(description=description, allow_abbrev=False)
    for option in options:
        settings = dict(option.settings)
        if given_only:
            settings["default"] = argparse.SUPPRESS
        parser.add_argument(option.flag, **settings)
    return parser


def parse(backend: str, argv: list[str] | None = None, description: str = "") -> TrainerConfig:
    """``argv`` (``sys.argv[1:]`` when ``None``) as ``backend``'s ``TrainerConfig``.

    Raises:
        SystemExit: status 2 (argparse's), its message on stderr: an unknown option, a bad value
            (naming the option and the value), an option ``backend`` does not apply (naming it,
            ``backend`` and the backends that apply it), or values ``backend`` refuses, alone or
            together (``REFUSALS``: precision=fp16 under parameter_server, with
            gradient-accumulation-steps > 1 under Horovod's TensorFlow trainer, with
            data-parallel=fsdp).
    """
    options = _options()
    parser = _parser(description or BACKENDS[backend], options, given_only=False)
    values = vars(parser.parse_args(argv))
    given = vars(_parser(description, options, given_only=True).parse_args(argv))
    for option in options:
        if option.dest in given and backend not in option.backends:
            parser.error(
                f"hyperparameter {option.flag.lstrip('-')} does not apply to {BACKENDS[backend]}: remove it from the "
                f"job's hyperparameters (it applies to {'; '.join(BACKENDS[b] for b in sorted(option.backends))})")
    for refusal in REFUSALS:
        if refusal.refuses(backend, values):
            parser.error(_refusal_message(refusal, backend, values))
    return TrainerConfig(backend=backend, **values)
