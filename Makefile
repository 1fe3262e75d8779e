# hapi: `make run` starts the embedded store + gateway; `make test` runs the suite.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
AWSCLI := .venv-awscli/bin/aws
PACKAGES := protocol gateway planner models sdk store cli examples
# mypy cannot follow the editable install's package-dir mapping (a path hook), so `hapi.*`
# imports would be Any to it. It checks a tree of links build/mypy/hapi/<pkg> -> <pkg>
# instead, where every `hapi.*` import resolves to the real sources (mypy_path).
MYPY_TREE := build/mypy/hapi
# The benchmarks (benchmarks/hapi_bench, the hapi-bench distribution) sit beside it.
BENCH_TREE := build/mypy/hapi_bench

.PHONY: wrk run test test-slow test-cluster check lint format bench-proxy bench-servers bench-pushdown bench-device bench-load bench-cluster bench bench-headtohead bench-augment clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml benchmarks/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q -e ./benchmarks
	touch $(STAMP)

# The AWS CLI pins botocore differently from boto3: it lives in a venv of its own.
$(AWSCLI):
	$(PYTHON) -m venv .venv-awscli
	.venv-awscli/bin/pip install -q awscli

# wrk (a C load generator) drives the load benchmarks; its driver has tests of its own.
wrk:
	command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)

# Flags for hapi up: make run ARGS='--port 9080 --store-port 9333'
run: $(STAMP)
	$(VENV)/bin/hapi up $(ARGS)

# The suite without the tests marked slow (minutes each: memory bounds, the demo, the
# testbed, exports of whole networks); `make test-slow` runs those, CI runs both. Tests
# marked cluster (root, network namespaces) run only in `make test-cluster`.
test: $(STAMP) $(AWSCLI) wrk
	HAPI_AWS_CLI=$(abspath $(AWSCLI)) $(PY) -m pytest -q -m "not slow and not cluster"

test-slow: $(STAMP) $(AWSCLI)
	HAPI_AWS_CLI=$(abspath $(AWSCLI)) $(PY) -m pytest -q -m "slow and not cluster"

# The multi-node store (root: namespaces, veths, a bridge, tc, cgroups), bounded in time:
# SIGINT after 15 minutes lets the fixtures tear the network down. Ends with the wire test's
# figures: without locality, the failover epoch, and last the locality line.
CLUSTER_OUT := build/test-cluster
test-cluster: $(STAMP)
	@rm -f $(CLUSTER_OUT)/*.txt
	HAPI_CLUSTER_OUT=$(abspath $(CLUSTER_OUT)) timeout -s INT -k 60 900 $(PY) -m pytest -q -m cluster tests/cluster
	@cat $(CLUSTER_OUT)/1-without-locality.txt $(CLUSTER_OUT)/2-failover.txt
	@cat $(CLUSTER_OUT)/locality.txt

check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@mkdir -p $(MYPY_TREE) && for p in $(PACKAGES); do ln -sfn ../../../$$p $(MYPY_TREE)/$$p; done
	@ln -sfn ../../benchmarks/hapi_bench $(BENCH_TREE)
	$(VENV)/bin/mypy $$(find -L $(MYPY_TREE) $(BENCH_TREE) -name '*.py' | sort)
	$(VENV)/bin/lint-imports

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench-proxy: $(STAMP) wrk
	command -v nginx >/dev/null || test -x /usr/sbin/nginx || (apt-get update -qq && apt-get install -y -qq nginx-light)
	$(VENV)/bin/hapi-bench proxy --out bench-results

# The gateway's app under uvicorn (its edge, what hapi serve runs) and under granian, in
# pass-through; granian is not one of hapi's dependencies, so this target installs it.
bench-servers: $(STAMP) wrk
	$(PY) -m pip install -q -e './benchmarks[servers]'
	$(VENV)/bin/hapi-bench servers --out bench-results

# Pushdown against a bare decode-and-run loop on the same cores, every split (a few minutes).
bench-pushdown: $(STAMP) wrk
	$(VENV)/bin/hapi-bench pushdown --out bench-results

# The storage node on a GPU: the gateway against the bare device loop (DALI where installed,
# else Pillow; batch 64), then the blocks: fidelity (TF32 off and on), samples/s per batch
# size, how a batch's time divides among blocks; needs a CUDA GPU (DEVICE_ARGS="--device
# cpu" to try it anywhere).
bench-device: $(STAMP) wrk
	$(VENV)/bin/hapi-bench device --out bench-results $(DEVICE_ARGS)

# Bounded load (60 s): a mixed Python load, then wrk at 150 connections through the gateway,
# nginx and the store; e.g. LOAD_ARGS="--workers 2".
bench-load: $(STAMP) wrk
	command -v nginx >/dev/null || test -x /usr/sbin/nginx || (apt-get update -qq && apt-get install -y -qq nginx-light)
	$(VENV)/bin/hapi-bench load --out bench-results $(LOAD_ARGS)

# Samples/s on 1, 2 and 3 storage nodes (root: namespaces), each behind a capped link and a
# CPU quota, pushdown with locality; e.g. CLUSTER_ARGS="--rate 50mbit --cpus 0.4".
bench-cluster: $(STAMP)
	timeout -s INT -k 60 1800 $(VENV)/bin/hapi-bench cluster scale --out bench-results/cluster $(CLUSTER_ARGS)

clean:
	rm -rf $(VENV) .venv-awscli build *.egg-info benchmarks/*.egg-info

# The two-tier testbed (root: network namespace, veth, tc tbf); `make bench QUICK=1` for --quick.
bench: $(STAMP)
	$(VENV)/bin/hapi-bench testbed $(if $(QUICK),--quick) --out bench-results/testbed

# Augmentation next to the data, its effect on learning: one head trained with no
# augmentation, fresh views, and K cached views (K = 1, 2, 4) over 3 seeds (5-10 minutes).
bench-augment: $(STAMP)
	$(VENV)/bin/hapi-bench augment --out bench-results/augment $(AUGMENT_ARGS)

# The same training job through s3torchconnector and hapi (root: the testbed), every cell
# (20-40 minutes: quiet or shared cores); `make bench-headtohead QUICK=1` for --quick (3-6).
bench-headtohead: $(STAMP)
	$(VENV)/bin/hapi-bench headtohead $(if $(QUICK),--quick) --out bench-results/headtohead $(HEADTOHEAD_ARGS)
