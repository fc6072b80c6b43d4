# The two commands a user needs: `make train` (the main job) and `make test` (every test).
# Both set this machine up first if needed (scripts/setup-host.sh; about 25 minutes the first
# time, mostly the Horovod build, which is then cached).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

VENV ?= $(CURDIR)/.venv
PYTHON := $(VENV)/bin/python
export PATH := $(VENV)/bin:$(PATH)

# make image / make train: the image flavor (cpu | gpu) and tag; RUN_IN=image runs the job in
# the image (the default), RUN_IN=host in the host's virtual environment.
FLAVOR ?= cpu
IMAGE ?= dtc:$(FLAVOR)
RUN_IN ?= image
# make train: the framework (pytorch | tensorflow), MPI processes on this host, epochs, and
# where the local /opt/ml tree goes.
FRAMEWORK ?= pytorch
PROCESSES_PER_HOST ?= 2
EPOCHS ?= 12
JOB_DIR ?= $(CURDIR)/build/job/opt/ml
# make cluster: a local SageMaker cluster of INSTANCE_COUNT containers (algo-1..N) running
# DISTRIBUTION (none | mpi | torch_distributed | multi_worker_mirrored_strategy |
# parameter_server) with builtin:$(FRAMEWORK), or JOB_FILE (JSON; see dtc_local/cluster.py);
# HYPERPARAMETERS="k=v k2=v2" adds hyperparameters; CLUSTER_ARGS passes any other flag.
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
SETUP_INPUTS := versions.env pyproject.toml scripts/setup-host.sh $(wildcard docker/*.sh docker/patches/*.patch)

.PHONY: setup image train cluster test clean

$(SETUP_STAMP): $(SETUP_INPUTS)
	scripts/setup-host.sh
	touch $@

setup: $(SETUP_STAMP)

# Builds with docker where a daemon runs, else buildah; reports time and size (scripts/build-image.sh).
image: $(SETUP_STAMP)
	FLAVOR=$(FLAVOR) IMAGE=$(IMAGE) scripts/build-image.sh

train: $(SETUP_STAMP) $(if $(filter image,$(RUN_IN)),image)
	@case "$(FRAMEWORK)" in pytorch|tensorflow) ;; *) echo "FRAMEWORK must be pytorch or tensorflow, got '$(FRAMEWORK)'" >&2; exit 2;; esac
	$(PYTHON) -m dtc_local.job_tree $(JOB_DIR) --digits --program builtin:$(FRAMEWORK) \
	  --mpi $(PROCESSES_PER_HOST) -p epochs=$(EPOCHS)
ifeq ($(RUN_IN),image)
	scripts/container.sh run --rm --shm-size 1g -v $(JOB_DIR):/opt/ml $(IMAGE) train
else
	SAGEMAKER_BASE_DIR=$(JOB_DIR) train
endif
	@echo "model written to $(JOB_DIR)/model:"; ls -l $(JOB_DIR)/model

cluster: $(SETUP_STAMP) image
	. scripts/podman-env.sh && $(PYTHON) -m dtc_local.cluster --job-dir $(CLUSTER_DIR) \
	  $(if $(JOB_FILE),--job-file $(JOB_FILE),--image $(IMAGE) --instance-count $(INSTANCE_COUNT) \
	    --processes-per-host $(PROCESSES_PER_HOST) --distribution $(DISTRIBUTION) --program builtin:$(CLUSTER_FRAMEWORK) \
	    -p epochs=$(EPOCHS)) \
	  $(foreach hp,$(HYPERPARAMETERS),-p $(hp)) $(CLUSTER_ARGS)

test: $(SETUP_STAMP) image
	DTC_IMAGE=$(IMAGE) $(PYTHON) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf build .pytest_cache
