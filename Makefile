# The two commands a user needs: `make train` (the main job) and `make test` (every test).
# Both set this machine up first if needed (scripts/setup-host.sh; measured times in
# docs/development.md: the first time is mostly the Horovod build, which is then cached).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

VENV ?= $(CURDIR)/.venv
PYTHON := $(VENV)/bin/python
export PATH := $(VENV)/bin:$(PATH)

# make image / make train: the image flavor (cpu | gpu) and tag; RUN_IN=image runs the job in
# the image (the default), RUN_IN=host in the host's virtual environment.
FLAVOR ?= cpu
IMAGE ?= dtc:$(FLAVOR)
# make gpu-verify / make gpu-check (and make test when the GPU build's inputs changed): the GPU image.
GPU_IMAGE ?= dtc:gpu
RUN_IN ?= image
# make train: the framework (pytorch | tensorflow), MPI processes on this host, epochs, the data
# (digits: 8x8 grayscale scans; photos: RGB crops of real photographs, dtc_train.photos), and
# where the local /opt/ml tree goes; HYPERPARAMETERS (below) adds hyperparameters.
FRAMEWORK ?= pytorch
PROCESSES_PER_HOST ?= 2
EPOCHS ?= 12
TRAIN_DATA ?= digits
JOB_DIR ?= $(CURDIR)/build/job/opt/ml
# Extra `docker/podman run` options for make train, e.g. CONTAINER_ARGS=--all-gpus on a GPU machine
# (scripts/container.sh turns it into Docker's --gpus all or podman's CDI device).
CONTAINER_ARGS ?=
# make cluster: a local SageMaker cluster of INSTANCE_COUNT containers (algo-1..N) running
# DISTRIBUTION (none | mpi | torch_distributed | multi_worker_mirrored_strategy |
# parameter_server) with builtin:$(FRAMEWORK) on TRAIN_DATA, or JOB_FILE (JSON; see dtc_local/cluster.py);
# HYPERPARAMETERS="k=v k2=v2" adds hyperparameters (make train too); CLUSTER_ARGS passes any other flag.
INSTANCE_COUNT ?= 2
DISTRIBUTION ?= mpi
JOB_FILE ?=
HYPERPARAMETERS ?=
CLUSTER_ARGS ?=
CLUSTER_DIR ?= $(CURDIR)/build/cluster
# TensorFlow-only strategies use builtin:tensorflow unless FRAMEWORK is given.
CLUSTER_FRAMEWORK = $(if $(and $(filter file,$(origin FRAMEWORK)),$(filter multi_worker_mirrored_strategy parameter_server,$(DISTRIBUTION))),tensorflow,$(FRAMEWORK))
# Extra pytest arguments, e.g. PYTEST_ARGS="-k unit".
PYTEST_ARGS ?=

SETUP_STAMP := $(VENV)/.setup-complete
SETUP_INPUTS := versions.env pyproject.toml scripts/setup-host.sh $(wildcard docker/*.sh docker/*.cmake docker/patches/*.patch docker/patches/*/*.patch)

.PHONY: setup image train cluster test test-unit test-fast lint push bench bench-gpu gpu-verify gpu-check clean

$(SETUP_STAMP): $(SETUP_INPUTS)
	scripts/setup-host.sh
	touch $@

setup: $(SETUP_STAMP)

# Builds with docker where a daemon runs, else buildah; reports time and size (scripts/build-image.sh).
image: $(SETUP_STAMP)
	FLAVOR=$(FLAVOR) IMAGE=$(IMAGE) scripts/build-image.sh

train: $(SETUP_STAMP) $(if $(filter image,$(RUN_IN)),image)
	@case "$(FRAMEWORK)" in pytorch|tensorflow) ;; *) echo "FRAMEWORK must be pytorch or tensorflow, got '$(FRAMEWORK)'" >&2; exit 2;; esac
	@case "$(TRAIN_DATA)" in digits|photos) ;; *) echo "TRAIN_DATA must be digits or photos, got '$(TRAIN_DATA)'" >&2; exit 2;; esac
	$(PYTHON) -m dtc_local.job_tree $(JOB_DIR) --$(TRAIN_DATA) --program builtin:$(FRAMEWORK) \
	  --mpi $(PROCESSES_PER_HOST) -p epochs=$(EPOCHS) $(foreach hp,$(HYPERPARAMETERS),-p $(hp))
ifeq ($(RUN_IN),image)
	scripts/container.sh run --rm --shm-size 1g $(CONTAINER_ARGS) -v $(JOB_DIR):/opt/ml $(IMAGE) train
else
	SAGEMAKER_BASE_DIR=$(JOB_DIR) train
endif
	@echo "model written to $(JOB_DIR)/model:"; ls -l $(JOB_DIR)/model
	@echo "report (plots and summary) in $(JOB_DIR)/output/data/report, TensorBoard events in $(JOB_DIR)/output/tensorboard:"
	@cat $(JOB_DIR)/output/data/report/summary.md

cluster: $(SETUP_STAMP) image
	. scripts/podman-env.sh && $(PYTHON) -m dtc_local.cluster --job-dir $(CLUSTER_DIR) \
	  $(if $(JOB_FILE),--job-file $(JOB_FILE),--image $(IMAGE) --instance-count $(INSTANCE_COUNT) \
	    --processes-per-host $(PROCESSES_PER_HOST) --distribution $(DISTRIBUTION) --program builtin:$(CLUSTER_FRAMEWORK) \
	    --data $(TRAIN_DATA) -p epochs=$(EPOCHS)) \
	  $(foreach hp,$(HYPERPARAMETERS),-p $(hp)) $(CLUSTER_ARGS)

# Every test, tier by tier, each phase timed (scripts/test.sh; what CI's .ci/run calls): setup,
# the CPU image, the GPU image when its build inputs differ from the last verification
# (tests/fixtures/gpu-verified.json; scripts/gpu_inputs.py), lint, then tests/unit,
# tests/integration, tests/cluster with tests/image, and tests/gpu.
test:
	MAKE="$(MAKE)" PYTHON=$(PYTHON) IMAGE=$(IMAGE) GPU_IMAGE=$(GPU_IMAGE) PYTEST_ARGS="$(PYTEST_ARGS)" scripts/test.sh

# tests/unit alone: no process started, seconds.
test-unit: $(SETUP_STAMP)
	$(PYTHON) -m pytest tests/unit $(PYTEST_ARGS)

# Everything but containers: lint, tests/unit and tests/integration (real train, mpirun, torchrun on this host).
test-fast: $(SETUP_STAMP)
	MAKE="$(MAKE)" PYTHON=$(PYTHON) PYTEST_ARGS="$(PYTEST_ARGS)" TEST_PHASES="lint unit integration" scripts/test.sh

# ruff (pyproject.toml) over every Python file; shellcheck over the shell scripts; hadolint over
# the Dockerfile (.hadolint.yaml: every finding fails, and why a rule is ignored).
lint: $(SETUP_STAMP)
	$(VENV)/bin/ruff check .
	shellcheck -x docker/*.sh scripts/*.sh
	$(VENV)/bin/hadolint --config .hadolint.yaml Dockerfile

# Builds FLAVORS, runs their in-image suite and pushes them to the ECR repository REPOSITORY in
# REGION by running buildspec.yml here, as CodeBuild runs it (dtc_local.buildspec; steps in
# scripts/release.sh). Needs AWS credentials; the AWS CLI is in the virtual environment.
REGION ?= $(or $(AWS_REGION),$(AWS_DEFAULT_REGION))
REPOSITORY ?= dtc
FLAVORS ?= cpu
push: $(SETUP_STAMP)
	@[ -n "$(REGION)" ] || { echo "make push needs REGION=<aws region> (or AWS_REGION), e.g. make push REGION=us-east-1 REPOSITORY=dtc" >&2; exit 2; }
	REGION=$(REGION) REPOSITORY=$(REPOSITORY) FLAVORS="$(FLAVORS)" $(PYTHON) -m dtc_local.buildspec buildspec.yml

# Benchmarks in the image (bench/run.py): JSON, plots and a ratio table under build/bench/;
# QUICK=1 runs tiny sizes in a few minutes (what make test checks); BENCH_ARGS passes other flags
# (e.g. BENCH_ARGS="--only A3,A8 --repeats 3").
QUICK ?=
BENCH_ARGS ?=
bench: $(SETUP_STAMP) image
	$(PYTHON) bench/run.py --image $(IMAGE) $(if $(QUICK),--quick) $(BENCH_ARGS)

# On a GPU machine: B1-B5 in the GPU image with a dated report (skips cleanly without a GPU).
bench-gpu: $(SETUP_STAMP)
	$(PYTHON) bench/run.py --gpu --image $(GPU_IMAGE) $(if $(QUICK),--quick)

# Builds the GPU image, runs every check that needs no GPU, records the verification (commit it).
gpu-verify: $(SETUP_STAMP) image
	IMAGE=$(IMAGE) GPU_IMAGE=$(GPU_IMAGE) PYTHON=$(PYTHON) scripts/gpu-verify.sh

# On a machine with NVIDIA GPUs: every GPU runtime check, with a dated report (scripts/gpu-check.sh).
gpu-check:
	GPU_IMAGE=$(GPU_IMAGE) scripts/gpu-check.sh

clean:
	rm -rf build .pytest_cache && mkdir -p build/wheels build/builder && : > build/wheels/.gitkeep && : > build/builder/.gitkeep   # tracked (Dockerfile)
