# The two commands of the README:
#   make book   set up .venv, export the package, execute every chapter, build _build/html
#   make test   set up .venv, check the export, run pytest, nbval and the strict book build
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NOTEBOOKS := _build/notebooks

export JUPYTER_PLATFORM_DIRS := 1
export PYDEVD_DISABLE_FILE_VALIDATION := 1

.PHONY: book test setup export export-check unit notebooks nbval html chapter clean

book: setup export html

test: setup export-check unit nbval html

# Create the environment once; reinstall when the requirements change.
setup: $(STAMP)
$(STAMP): requirements.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	@touch $@

export: setup
	$(BIN)/python -m tools.export

export-check: setup
	$(BIN)/python -m tools.export --check

unit: setup
	$(BIN)/python -m pytest tests

# .ipynb copies of the chapters, in a build folder (never beside the .md files).
notebooks: setup
	rm -rf $(NOTEBOOKS)
	$(BIN)/python -m tools.notebooks --out $(NOTEBOOKS)

nbval: notebooks
	$(BIN)/python -m pytest --nbval-lax $(NOTEBOOKS)

# Strict: every page rebuilt and every notebook executed; a warning or a failing cell fails.
html: setup
	$(BIN)/jupyter-book build . --all -W -n --keep-going

# One chapter as a notebook under nbval: make chapter CHAPTER=chapters/02_embeddings.md
chapter: setup
	$(BIN)/python -m tools.notebooks --out $(NOTEBOOKS) $(CHAPTER)
	$(BIN)/python -m pytest --nbval-lax $(NOTEBOOKS)/$(basename $(notdir $(CHAPTER))).ipynb

clean:
	rm -rf _build
