# The few commands a contributor needs. Each script creates .venv on first use.
.PHONY: test lint demo bench soak outage faults churn ci-stress

test:            ## lint, type-check and run the test suite (what CI runs)
	scripts/test.sh

lint:
	.venv/bin/ruff check watchproxy kubefake tests bench
	.venv/bin/ruff format --check watchproxy kubefake tests bench
	.venv/bin/mypy

demo:            ## the proxy in front of an embedded fake apiserver
	scripts/demo.sh

bench:           ## fan-out benchmark: proxy vs direct vs raw broadcast ceiling
	.venv/bin/python -m bench.fanout

outage:          ## 30 s outage with 50 clients: watchproxy vs kubectl proxy
	.venv/bin/python -m bench.outage

soak:            ## 10-minute soak with 100 clients and random upstream faults
	.venv/bin/python -m bench.soak --duration 600 --clients 100

faults:          ## 20 outage-and-recovery runs through a fault-injecting TCP proxy (~20 min)
	scripts/faults.sh --runs 20

churn:           ## 1,000 clients that come and go for 5 minutes leave nothing behind
	WATCHPROXY_CHURN_SECONDS=300 .venv/bin/pytest -n 0 tests/component/test_client_churn.py

ci-stress:       ## 5 fresh-clone CI runs with cold caches and a CPU hog (hours; see the script)
	scripts/ci-stress.sh -n 5
