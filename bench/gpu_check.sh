#!/usr/bin/env bash
# The GPU checklist as one timed script, for the device machine (DEVELOPERS.md): each step has its
# own limit so one slow step cannot eat the lease; every log lands in $OUT (or ./gpu-out).
# Usage on the device: bash bench/gpu_check.sh [STEP...] (default: every step, in order). Wheels for the server extras, if
# carried in .whl/, are installed to /tmp/site first (the machine reaches no registry).
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
STEPS=" ${*:-pytest attention branch outputz overhead profile compiled trainer} "
step() {  # step NAME SECONDS CMD...
  local name=$1 limit=$2; shift 2
  [[ $STEPS == *" $name "* ]] || return 0
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "== $name rc=$? $((SECONDS - t0))s" | tee -a "$OUT/summary.log"
  tail -n 25 "$OUT/$name.log"
}
python3 -c 'import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(0))' | tee "$OUT/summary.log"
H="python3 bench/hooks_overhead.py --device cuda"
step pytest 70 python3 -m pytest -q -p no:cacheprovider tests/hooks tests/trainer -k cuda
step attention 25 $H --attention --rounds 10
step branch 25 $H --branch --rounds 10
step outputz 40 $H --output-z --rounds 10
step overhead 150 $H --control --models llama,dense --modes eager --rounds 4 --block 10
step profile 40 $H --profile --every 1 --models llama --modes eager --profile-steps 2
# issue 34: compiled with hooks / compiled without, every=1 and every=10 (the Llama's first logged step runs the hooks' way)
step compiled 150 $H --compile --models llama --every 1,10 --rounds 3 --block 10
step trainer 100 python3 bench/trainer_throughput.py --device cuda --preset paper --depth 8 --only dense --rounds 3 --steps 3
