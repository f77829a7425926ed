# Two commands (see README.md): `make lab` and `make test`. Both set up .venv first.
# The virtual environment is created with $(PYTHON) when missing, and the project is
# (re)installed into it only when pyproject.toml changed, so later runs start at once.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST := $(BIN)/python -m pytest

# Notebook directories run by nbval, one line each; a directory without notebooks is
# skipped. Strict: every stored output must match. Lax: only errors fail.
NBVAL_STRICT += notebooks
NBVAL_STRICT += solutions
NBVAL_LAX    += labs

# The notebook checks run on other CPU kernels than the ones that most likely stored the
# outputs (AVX2 or AVX-512): torch's portable kernels, MKL's SSE4.2 code path, oneDNN's
# SSE4.1 one. An output that depends on rounding noise then fails here, on the developer's
# own machine, rather than on a learner's (docs/determinism.md).
NBVAL_ENV := ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41

# Parallel pytest-xdist workers for `make test`: one per CPU core (at most 8). The tests
# and the notebook kernels run Python on one core each, so one worker per core keeps every
# core busy; `make test JOBS=1` runs the tests in one worker, one after the other.
JOBS ?= $(shell $(PYTHON) -c "import os; n = len(os.sched_getaffinity(0)) if hasattr(os, \
	'sched_getaffinity') else os.cpu_count(); print(max(1, min(8, n or 1)))" 2>/dev/null || echo 1)
# A test module runs whole in one worker (tests/conftest.py); so does a notebook (its cells
# share one kernel).
XDIST_TESTS  = -n $(JOBS) --dist loadfile
XDIST_NBVAL  = -n $(JOBS) --dist loadfile
# When make started (seconds since 1970), before .venv was set up: `make test` prints how
# long the setup took, and the total.
STARTED := $(shell date +%s)

# Extra arguments for `jupyter lab`, e.g. `make lab LAB_ARGS="--port=9999 --no-browser"`.
LAB_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help setup lab test labs progress doctor slides workshop clean distclean

help:
	@echo "make lab        set up .venv, then start JupyterLab on notebooks/"
	@echo "make test       set up .venv, then run the tests and check the notebooks"
	@echo "                (JOBS=n parallel workers; default one per CPU core)"
	@echo "make progress   run your labs and show which exercises pass"
	@echo "                (JSON=progress.json NAME=yourname: a file to hand in)"
	@echo "make doctor     check this machine before a workshop (no setup needed)"
	@echo "make slides     build reveal.js slides of the lessons into build/slides/ (offline)"
	@echo "make workshop   regenerate workshop/agendas.md and the instructor notes' timings"
	@echo "make labs       regenerate labs/ from solutions/, keeping labs you worked in"
	@echo "                (for contributors; FORCE=1 replaces those too)"
	@echo "make setup      only set up .venv (done by lab and test)"
	@echo "make clean      remove caches and build files"
	@echo "make distclean  clean, and remove .venv too"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e .
	$(BIN)/python -m workbook.restart
	@touch $@

setup: $(STAMP)

# (workbook.restart again: a clone set up before it existed gets it without a reinstall)
lab: $(STAMP)
	$(BIN)/python -m workbook.restart
	JUPYTER=$(BIN)/jupyter scripts/lab.sh $(LAB_ARGS)

# Every step runs even when an earlier one fails, so one CI run reports everything. The
# time of each step (setup included: a fresh clone installs everything) is printed at the end.
test: $(STAMP)
	@status=0; summary=""; \
	record() { summary="$$summary$$(printf '  %-34s%6d s   %s' "$$1" "$$2" "$$3")\n"; }; \
	step() { name=$$1; shift; echo "$$*"; began=$$(date +%s); \
	    if "$$@"; then verdict=passed; else verdict=FAILED; status=1; fi; \
	    record "$$name" $$(( $$(date +%s) - began )) $$verdict; }; \
	record "setup (venv and install)" $$(( $$(date +%s) - $(STARTED) )) done; \
	step "unit tests (tests/)" $(PYTEST) $(XDIST_TESTS) tests; \
	for run in $(NBVAL_STRICT:%=%:--nbval) $(NBVAL_LAX:%=%:--nbval-lax); do \
	    dir=$${run%%:*}; mode=$${run#*:}; \
	    if [ -n "$$(find "$$dir" -name '*.ipynb' -not -path '*/.ipynb_checkpoints/*' \
	                2>/dev/null | head -n 1)" ]; then \
	        step "nbval $$dir/ ($$mode)" \
	            env $(NBVAL_ENV) $(PYTEST) $$mode --nbval-current-env $(XDIST_NBVAL) "$$dir"; \
	    else \
	        echo "nbval: no notebooks in $$dir/, skipped"; record "nbval $$dir/" 0 skipped; \
	    fi; \
	done; \
	echo; echo "make test: the time of each step ($(JOBS) workers; $$(uptime | sed 's/.*load/load/'))"; \
	printf '%b' "$$summary"; \
	printf '  %-34s%6d s   %s\n' total $$(( $$(date +%s) - $(STARTED) )) \
	    "$$([ $$status = 0 ] && echo passed || echo FAILED)"; \
	exit $$status

# A lab that holds a learner's work is kept; FORCE=1 replaces it anyway.
labs: $(STAMP)
	$(BIN)/python -m workbook.labs $(if $(FORCE),--force)

# JSON=FILE also writes a file to hand in (python -m workbook.handin FOLDER reads them);
# NAME=... is the name it shows (default: the login name, "learner" in the Docker image).
progress: $(STAMP)
	$(BIN)/python -m workbook.progress $(if $(JSON),--json $(JSON)) \
	    $(if $(NAME),--name '$(subst ','\'',$(NAME))')

# Runs before any setup too (with $(PYTHON) until .venv exists): a machine that cannot
# set up is exactly what the doctor must explain.
doctor:
	@$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) -m workbook.doctor

slides: $(STAMP)
	$(BIN)/python -m workbook.slides

workshop: $(STAMP)
	$(BIN)/python -m workbook.instructor

clean:
	find . \( -path ./$(VENV) -o -path ./.git \) -prune -o -type d \( -name __pycache__ \
	    -o -name .ipynb_checkpoints -o -name .pytest_cache -o -name '*.egg-info' \) \
	    -prune -exec rm -rf {} +
	rm -rf build dist

distclean: clean
	rm -rf $(VENV)
