# Two commands do everything on a fresh machine (each installs what it needs into .venv/):
#   make lab    install, then open the lessons in JupyterLab
#   make lessons  rebuild lessons/ from solutions/ (the exercise stubs)
#   make test   install, then run the package tests and the notebooks under strict nbval (what CI runs)
#   make test-fast  the package tests not marked slow, no notebooks: the edit-run loop (under 2 min on 2 cores)
#   make test-cpus  the notebooks under each float path of this CPU (NOTEBOOKS=... for a few)
#   make test-colab  every lesson in a simulated Colab: its Python and every package version of COLAB (tests/colab_env.py)
#   make gpu-check  on a CUDA machine: every solutions notebook with CUDA + the GPU tests (tests/gpu/check.py)
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# tests and CI read WikiText-2 from ../shared/data when it is there (no dataset hub needed): the folder of local
# corpus copies, MINIGATE_CORPORA_DIR
export MINIGATE_CORPORA_DIR ?= $(if $(wildcard ../shared/data),$(abspath ../shared/data),)
NBVAL   := --nbval --nbval-current-env --nbval-sanitize-with lessons/nbval_sanitize.cfg

.PHONY: install lab lessons test test-fast test-cpus test-colab gpu-check bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	# the CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build here. --no-compile:
	# Python compiles a module on its first import; pip would compile all of them (torch, transformers, jupyterlab...)
	# for modules no test imports. The rest (about 150 packages) with uv, Astral's pip-compatible installer: the same
	# versions pip resolves (pip list compared), in 5 s instead of 55 (uv compiles nothing either); torch, installed
	# first, satisfies the rest's requirement of it
	$(BIN)/pip install --quiet --no-compile "torch==2.13.0" uv
	$(BIN)/uv pip install --quiet --python $(BIN)/python -e ".[course,dev]"
	touch $(STAMP)

# JupyterLab refuses to start as root (a container, a cloud VM, a CI runner) unless given its own --allow-root switch;
# nbgrader's server extensions are the instructor's (python -m minigate.course nbgrader), so the learner's lab leaves
# them off (and with them a warning about a missing nbgrader_config.py). ARGS: more JupyterLab options, e.g. --no-browser
LAB_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root) $(foreach e,formgrader assignment_list course_list \
            validate_assignment,--ServerApp.jpserver_extensions nbgrader.server_extensions.$(e)=False)

lab: install
	$(BIN)/jupyter lab lessons/ $(LAB_ARGS) $(ARGS)

lessons: install
	$(BIN)/python -m minigate.course build

# solutions/ runs under another float path than lessons/ (the next narrower one: AVX2 kernels on an AVX-512 CPU,
# ATen's default ones with MKL at SSE4.2 on an AVX2 CPU): each run of make test checks the stored outputs and the
# asserts on two ways of adding the same numbers. The two pytest runs share one token cache.
FORCED   = $(shell $(BIN)/python tests/float_paths.py --other)

# JOBS pytest workers (pytest-xdist), one torch thread each, a test file or notebook per worker: on CI's 2 cores two
# single-threaded workers beat one process with two threads (most of a test is Python, not matmuls)
JOBS    ?= 2
XDIST    = -n $(JOBS) --dist loadfile
# solutions/ in the order given, the longest notebooks first (xdist's own order is by number of cells, which can leave
# the longest for last, one worker running it alone). The first run keeps xdist's order: tried longest-first, it took
# 957 s against 796 s in xdist's order (another day on the same 2 cores), its subprocess-heavy tests (test_grow,
# test_nbgrader) each slower next to the longest notebooks. Seconds per notebook in solutions/ under make test on a
# 2-core AVX-512 machine (its AVX2 path): 08 139, 03 74, 04 46, 06 45, 07 23, then 05, 02 and 01 under 20 each.
LONGEST  = 08_beyond_the_paper 03_training_tiny_models 07_paper_1b_models 04_sinks_and_massive_activations \
           06_breaking_the_gates
SOLUTIONS = $(foreach n,$(LONGEST),solutions/$(n).ipynb) \
            $(filter-out $(foreach n,$(LONGEST),solutions/$(n).ipynb),$(sort $(wildcard solutions/*.ipynb)))
PYTEST   = OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/pytest $(XDIST)
# the same from the wheel's environment (below); PYTHONSAFEPATH: no process of it imports the checkout's minigate from
# the current folder
WHEEL_PYTEST = OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONSAFEPATH=1 $$tmp/wheel/env/bin/python -m pytest $(XDIST)

# solutions/ runs from a wheel, as Colab and `pip install` get minigate: built once from the files git tracks
# (tests/colab_env.py wheel) and installed, not editable, into an environment of .venv's other packages, whose python
# runs pytest and so the notebooks' kernels: a file the wheel lacks fails here. tests/test_package_data.py checks the
# same wheel; lessons/ runs on the editable install.
test: install
	$(BIN)/ruff check minigate tests scripts research
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && mkdir "$$tmp/cache" && \
	export MINIGATE_CACHE_DIR=$$tmp/cache MINIGATE_WHEEL_DIR=$$tmp/wheel && \
	$(BIN)/python tests/colab_env.py wheel $$tmp/wheel && \
	$(BIN)/python tests/float_paths.py --show && \
	$(PYTEST) tests/ $(wildcard lessons/*.ipynb) $(NBVAL) --durations=15 && \
	$(FORCED) $(BIN)/python tests/float_paths.py --show && \
	$(FORCED) $(WHEEL_PYTEST) --no-loadscope-reorder $(SOLUTIONS) $(NBVAL) --durations=5

# The edit-run loop: tests/ without the tests marked slow (@pytest.mark.slow: training, subprocesses, notebooks, the
# wheel; registered in tests/conftest.py) and without the notebooks. make test runs them all.
test-fast: install
	$(PYTEST) tests/ -m "not slow" --durations=5

# Every lesson end to end in a simulated Colab (tests/colab_env.py, COLAB: its Python and every package of it at Colab's
# version, from PyPI; torch's CUDA build, a 4 GB download, runs on the CPU), minigate installed by the set-up cell from
# the working tree's files; prints each lesson's result and time. NOTEBOOKS=lessons/NN_name.ipynb for a few. About 17
# min on 2 cores.
test-colab: install
	cache=$$(mktemp -d) && trap 'rm -rf "$$cache"' EXIT && export MINIGATE_CACHE_DIR=$$cache && \
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(BIN)/python tests/colab_env.py colab $(NOTEBOOKS)

# the notebooks under every float path this CPU has (tests/float_paths.py): native, SSE4.2, AVX2 and AVX-512
test-cpus: install
	$(BIN)/python tests/float_paths.py --jobs $(JOBS) $(NOTEBOOKS)

gpu-check: install
	$(BIN)/python tests/gpu/check.py

bench: install
	$(BIN)/python -m minigate.bench model
	$(BIN)/python -m minigate.bench train
	$(BIN)/python -m minigate.bench ablation
	$(BIN)/python -m minigate.bench ddp

clean:
	rm -rf $(VENV) *.egg-info
