#!/usr/bin/env bash
# Installs the system tools the test suite drives for real (idempotent, quiet when present):
#   promtool and the Prometheus server (Debian 'prometheus'), Alertmanager (Debian
#   'prometheus-alertmanager': the demo and tests/e2e/test_alerting.py run both as child processes),
#   headless Chromium and its driver (Debian 'chromium', 'chromium-driver'). Called by `make test`;
#   safe to run by hand.
set -euo pipefail
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
[ -x /usr/bin/prometheus-alertmanager ] || command -v prometheus-alertmanager >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "installing system packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
