# The Speculative Decoding Lab. `make demo` and `make test` do all the set-up themselves; experiments: `make run`.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTEST := $(PY) -m pytest -q --durations=20
export TOKENIZERS_PARALLELISM := false

.PHONY: setup setup-data setup-browser peers demo test figures book results exercises lab run gpu-check clean

# The venv with pip (it finds the CPU build of torch via PIP_FIND_LINKS), the pinned lab, then the data wheels;
# then `doctor` says what this machine will run (one line each, a few seconds).
setup: $(STAMP)
	@$(PY) -m lab doctor
$(STAMP): pyproject.toml requirements/data.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet -e .
	$(MAKE) setup-data
	touch $(STAMP)

# The model and data wheels, with --no-deps: their declared dependencies are heavy and unneeded.
setup-data:
	$(PY) -m pip install --quiet --no-deps -r requirements/data.txt

# Debian's package $(1) where its command is missing; allowed to fail (no apt), saying what then skips ($(2)).
apt_install = command -v $(1) >/dev/null || (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1) \
	|| (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1))) \
	|| echo "[setup] could not install $(1): $(2)"

# Debian's chromium for tests/test_browser.py (that test skips and says why without it).
setup-browser:
	@$(call apt_install,chromium,tests/test_browser.py will be skipped)

# llama.cpp for the llamacpp methods: llama-cpp-python built from its source for this CPU's own instruction sets
# (~10 min; GGML_NATIVE, AMX off: it faults on some of these CPUs), llama-bench built from the same vendored
# source into .cache/llama.cpp/build/bin, and the source's conversion script and gguf package unpacked into
# .cache/llama.cpp (the BF16 and Q4_0 files).
LLAMACPP := llama_cpp_python-0.3.36
GGML_FLAGS := -DGGML_NATIVE=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
peers: setup
	$(PY) -m pip download --quiet --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d .cache/llama.cpp
	$(PY) -c "import llama_cpp" 2>/dev/null || CMAKE_ARGS="$(GGML_FLAGS)" \
		$(PY) -m pip install --quiet --no-cache-dir .cache/llama.cpp/$(LLAMACPP).tar.gz
	tar -xzf .cache/llama.cpp/$(LLAMACPP).tar.gz -C .cache/llama.cpp --strip-components=3 \
		$(addprefix $(LLAMACPP)/vendor/llama.cpp/,convert_hf_to_gguf.py conversion gguf-py)
	$(PY) -m pip install --quiet sentencepiece==0.2.3
	test -x .cache/llama.cpp/build/bin/llama-bench || (tar -xzf .cache/llama.cpp/$(LLAMACPP).tar.gz -C .cache/llama.cpp \
		$(LLAMACPP)/vendor/llama.cpp && cmake -S .cache/llama.cpp/$(LLAMACPP)/vendor/llama.cpp \
		-B .cache/llama.cpp/build $(GGML_FLAGS) -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
		-DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /dev/null \
		&& cmake --build .cache/llama.cpp/build --target llama-bench -j 2 > /dev/null)

# AR, prompt lookup and EAGLE-2 on 4 MT-Bench prompts, on the fastest exact engine, the one on the GGUF's own Q4_1
# blocks (it reads 97 MB a forward where the bfloat16 engine reads 269 MB); EAGLE-2's tree from this machine's tuning.
demo: setup
	$(PY) -m lab bench --methods ar,pld,eagle2 --dataset mt_bench --limit 4 --max-new-tokens 64 \
		--dtype q4_1 --eagle-head eagle1-gpu --json demo/demo.json --figure demo/demo_speed.png

# Debian's clang (tests/test_build.py), line lengths, the whole suite, every chapter whole (instructor/) in fast
# mode, the student copies in sync.
test: setup setup-browser
	@$(call apt_install,clang,the clang build of tests/test_build.py will be skipped outside CI)
	$(VENV)/bin/ruff check lab tests
	$(PYTEST) tests
	LAB_FAST=1 $(PYTEST) --nbmake --nbmake-timeout=900 instructor

# Every notebook at full size: figures/ and figures/manifest.json (one: python -m lab.figures NOTEBOOK), then RESULTS.md.
figures: setup
	$(PY) -m lab.figures
	$(PY) -m lab.results

# The rendered course in book/: from a clean commit, the screenshots and every chapter at full size, then the
# pages (solutions removed), the course page and an exported inspector session; book/build.json says how long.
book: setup setup-browser
	$(PY) -m lab.book
	$(PY) -m lab.results

# RESULTS.md and the README's generated blocks, from the JSON files under data/.
results: setup
	$(PY) -m lab.results

# The student chapters in notebooks/, from instructor/ (solution cells stubbed, outputs dropped).
exercises: setup
	$(PY) -m lab.exercises

# JupyterLab on the student chapters (the instructor's: open instructor/).
lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks

# An experiment by name: `make run E=NAME` runs `python -m lab run NAME`; `make run` lists them all.
run: setup
	@if [ -z "$(E)" ]; then $(PY) -m lab run --list; else $(PY) -m lab run $(E); fi

# On a lent GPU machine with its own python3: the kernel tests on the GPU, then the kernel benchmark.
gpu-check:
	python3 -m pytest -q -p no:cacheprovider tests/test_kernels_chain.py tests/test_kernels_tree.py \
		tests/test_kernels_attention.py
	python3 -m lab.kernels.bench --out $${OUT:-data/kernel_bench}

# The caches (features, checkpoints, the dequantised target): rebuilt on demand.
clean:
	rm -rf .cache
