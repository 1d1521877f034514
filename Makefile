# The two commands of the README: `make run` and `make test`.
VENV := .venv
VMTAX := $(VENV)/bin/vmtax

.PHONY: deps run test test-unit bench bench-stats clean

deps:
	@bash scripts/bootstrap.sh

run: deps
	$(VMTAX) run

test: deps
	$(VENV)/bin/pytest -q

test-unit: deps
	$(VENV)/bin/pytest -q -m "not live"

bench: deps
	$(VENV)/bin/python scripts/bench.py

bench-stats: deps
	$(VENV)/bin/python scripts/bench_stats.py

clean:
	rm -rf $(VENV) results test-artifacts
