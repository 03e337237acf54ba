# commbench: the README's two commands are `make bench` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch is pinned so that a CPU-only machine here gets the CPU build. Elsewhere, point pip at
# PyTorch's CPU wheel index: make bench TORCH_PIP_ARGS="--index-url <that index>".
TORCH_SPEC     ?= torch==2.13.0
TORCH_PIP_ARGS ?=
NP ?= 4

.PHONY: bench test test-launchers test-libs test-% suites results gpu-check cluster-check cluster-bench mutate lint info clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[mpi,plot,dev]"
	touch $@

bench: $(VENV)/.installed  ## set up, run the default suite on a local CPU world, write results/
	$(BIN)/commbench run --np $(NP)

test: $(VENV)/.installed  ## set up, run the test suite
	$(BIN)/python -m pytest

# torchrun and mpiexec started as a user starts them: each rank imports torch afresh, 5 to 9 s a
# test, so the default pytest skips these (pytest --launchers runs them with the rest)
test-launchers: $(VENV)/.installed  ## the tests that start torchrun and mpiexec themselves
	$(BIN)/python -m pytest -p no:cacheprovider --launchers -m launcher

# megatron-core and DeepSpeed (pure Python: DS_BUILD_OPS=0); an audit keeps DeepSpeed from
# compiling its CPU-only shared-memory op (commbench/studies/audit.py), so nothing is built
test-libs: $(VENV)/.installed  ## the audit on megatron-core's and DeepSpeed's own code (the libs extra)
	DS_BUILD_OPS=0 $(BIN)/python -m pip install -q -e ".[libs]"
	$(BIN)/python -m pytest -p no:cacheprovider -rs tests/test_audit_libs.py

test-%: $(VENV)/.installed  ## the test suite under mpiexec with % ranks, e.g. make test-4
	$(BIN)/mpiexec -n $* $(BIN)/python -m pytest -p no:cacheprovider --launchers $(PYTEST_ARGS)

suites: $(VENV)/.installed  ## benchmark suites; pytest-benchmark records under results/
	$(BIN)/python -m pytest suites -m bench --benchmark-enable --benchmark-autosave \
		--benchmark-storage=file://results/pytest-benchmark

# every top-level table of results/ for this machine class, from a clean commit (the tables
# record it; results/ itself may differ), each command at the settings results/README.md gives
PATTERN_TABLES := tp_mlp tp_layer vocab ddp zero pp ulysses ulysses_zero3 ring_attention moe_gating moe
results: $(VENV)/.installed  ## regenerate results/*: about 50 min on 2 cores, nothing else running
	@git diff --quiet HEAD -- . ':(exclude)results' || { \
		echo "make results: commit or stash your changes first (each table records its commit)" >&2; exit 2; }
	$(BIN)/commbench run --np 4
	$(BIN)/commbench run --np 2 -b 8 -e 32M -f 4
	for p in $(PATTERN_TABLES); do $(BIN)/commbench run $$p --np 4 || exit $$?; done
	$(BIN)/commbench claims --np 4
	for n in 2 3 4 8; do $(BIN)/commbench run numerics --np $$n || exit $$?; done
	$(BIN)/python suites/memory_bench.py --np 4
	for n in 2 4; do $(BIN)/commbench run model --np $$n || exit $$?; done
	for t in gloo mpi; do for n in 2 4; do $(BIN)/commbench run versus --np $$n --transport $$t \
		-b 8 -e 32M -f 4 --rounds 8 || exit $$?; done; done
	$(BIN)/commbench run overhead --np 2 -b 8 -e 64M -f 2 -n 50 -w 10 --rounds 10
	$(BIN)/commbench predict published

gpu-check: $(VENV)/.installed  ## one GPU: every pattern and collective over NCCL; fails without CUDA
	$(BIN)/commbench gpu-check
	$(BIN)/python -m pytest -m gpu -rs tests/test_gpu.py

# root: Open MPI's mpirun, a one-host Slurm and an emulated two-node cluster (network namespaces
# and a tc-shaped link); installs what it lacks, leaves nothing running. Not part of make test.
cluster-check: $(VENV)/.installed  ## root: mpirun (Open MPI), srun (Slurm), an emulated 2-node cluster
	$(BIN)/python suites/cluster/check.py

cluster-bench: $(VENV)/.installed  ## root: all-reduce on the emulated cluster at 10 and 1 Gbit/s -> results/cluster_*
	rm -rf .cluster-runs
	$(BIN)/python suites/cluster/measure.py --out .cluster-runs
	$(BIN)/python suites/cluster/report.py .cluster-runs > /dev/null

# mutmut forks a warm process per mutant; torch's thread pool does not survive a fork (mutants
# hung until the timeout), hence one thread
mutate: $(VENV)/.installed  ## mutation testing of the pure modules; writes results/mutation.md
	$(BIN)/python -m pip install -q "mutmut==3.8.1"
	rm -rf mutants
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/mutmut run > /dev/null
	$(BIN)/python suites/mutation_report.py > results/.mutation.md && mv results/.mutation.md results/mutation.md
	@head -8 results/mutation.md | tail -2

lint: $(VENV)/.installed
	$(BIN)/ruff check commbench tests suites

info: $(VENV)/.installed
	$(BIN)/commbench info

clean:
	rm -rf $(VENV) $(VENV)-openmpi .pytest_cache .hypothesis .benchmarks mutants .cluster-runs
