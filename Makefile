# The two commands of the README: `make run` and `make test`.
VENV := .venv
VMTAX := $(VENV)/bin/vmtax
# Release sources of the microVM targets' VMMs (Firecracker, Cloud Hypervisor), where this
# machine keeps them; `make builds` builds those found there, once.
VENDOR ?= ../shared/vendor

.PHONY: deps venv run test builds test-unit lint bench bench-stats torture torture-density lab-census clean

deps:
	@bash scripts/bootstrap.sh

# Only .venv: no root, no apt (enough for lint and the unit tests).
venv:
	@bash scripts/bootstrap.sh --venv

# Only what the default plan needs: a plan's other plugins install theirs on first use.
run:
	@bash scripts/bootstrap.sh --run
	$(VMTAX) run

# --durations: CI's log names the slowest tests, where make test's time goes.
test: deps lint builds
	$(VENV)/bin/pytest -q --durations=25

# What the live tests use that vmtax otherwise builds on first use, built here before
# pytest: its progress bar shows (pytest captures output) and a failed build stops with one
# line instead of failing test after test. Each does nothing once built.
builds: deps
	$(VENV)/bin/python -m vmtax.guest.minimal_kernel
	$(VENV)/bin/python -m vmtax.helpers.kernel_tree
	$(VENV)/bin/python -m vmtax.helpers.serving_tools
	$(VENV)/bin/python scripts/benchstat.py > /dev/null
	$(VENV)/bin/python -m vmtax.helpers.vsock_relay
	$(VENV)/bin/python -m vmtax.helpers.vmm_build $(wildcard $(VENDOR)/firecracker-*.tar.gz $(VENDOR)/cloud-hypervisor-*.tar.gz)

# Live tests are reported as skipped, with the reason (tests/conftest.py).
test-unit: venv
	VMTAX_UNIT_ONLY=1 $(VENV)/bin/pytest -q

lint: venv
	$(VENV)/bin/ruff check src tests scripts
	$(VENV)/bin/mypy src
	$(VENV)/bin/lint-imports

bench: deps
	$(VENV)/bin/python scripts/bench.py

bench-stats: deps
	$(VENV)/bin/python scripts/bench_stats.py

# kill -9, fuzzing, corrupt databases, planted files: the attacks of scripts/torture_attacks/
# (issue #16, #46); `make test` runs its --quick form.
torture: deps
	$(VENV)/bin/python scripts/torture.py

# kill -9 with 200 TCG guests of `vmtax density` up: nothing left within 10 s (issue #37;
# tens of minutes, so in neither `make test` nor `make torture`).
torture-density: deps
	$(VENV)/bin/python scripts/torture_density.py --instances 200

# The lab's nested faults counted per configuration, 20 labs each (issue #49; docs/lab.md
# has the table): hours, so in neither `make test` nor `make bench`. CONFIGS=a,b picks.
lab-census: deps
	$(VENV)/bin/python scripts/lab_census.py $(if $(CONFIGS),--configs $(CONFIGS))

clean:
	rm -rf $(VENV) results test-artifacts
