#!/usr/bin/env bash
# The peers of bench/peers.py (MLflow, Aim, TensorBoard writer) in their own virtualenv, .venv-peers,
# never in the project's dependencies. Usage: bench/peers_env.sh [python]   (default: python3)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
py="${1:-python3}"
"$py" -m venv "$here/.venv-peers"
"$here/.venv-peers/bin/pip" install --quiet --upgrade pip
"$here/.venv-peers/bin/pip" install --quiet "mlflow>=2.10" "aim>=3.19" tensorboardX tensorboard
echo "peers installed in $here/.venv-peers"
