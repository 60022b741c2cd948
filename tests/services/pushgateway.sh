#!/usr/bin/env bash
# Install Debian's Prometheus Pushgateway, which the metrics tests start themselves on a free port
# (tests/integration/test_metrics.py). Idempotent; needs root (apt-get). Starts nothing.
set -euo pipefail

if ! command -v prometheus-pushgateway >/dev/null; then
  echo "pushgateway.sh: installing Debian's prometheus-pushgateway package"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus-pushgateway >/dev/null
  # the package's own service (port 9091) is not the tests': they start theirs on a free port
  pkill -f '^/usr/bin/prometheus-pushgateway' 2>/dev/null || true
fi
echo "pushgateway.sh: $(prometheus-pushgateway --version 2>&1 | head -n 1)"
