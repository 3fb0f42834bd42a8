#!/usr/bin/env bash
# The measurements of docs/performance.md on a machine with a real NVIDIA GPU, in two
# parts that each fit one device-tool call (10 minutes). Logs go to $OUT (or ./out).
#   bash bench/h100.sh hardware   # hardware tests, NVML call costs, memory, scrape latency
#   bash bench/h100.sh cost       # CPU and RSS side by side with nvitop-exporter, CUDA load on:
#                                 # 3 rounds of 60 s windows, medians, the table against the
#                                 # targets (bench/cost_table.py compare; about 7 minutes)
#   bash bench/h100.sh idle       # the exporter alone, idle, at 100 ms / 1 s / 10 s (about 4 min)
#   bash bench/h100.sh idle-gpus  # the same on 1 and on 4 GPUs of one machine (4 or more
#                                 # GPUs: nvidia-h100-x4), per thread, the 4 / 1 ratio against
#                                 # 3x (bench/cost_model.py --daemon --nvml real; about 6 min)
#   bash bench/h100.sh energy     # per-process energy measured from outside at the defaults:
#                                 # the daemon, two CUDA workers per GPU, /metrics scraped
#                                 # around each scenario (bench/energy_outside.py; about
#                                 # 5.5 minutes; extra arguments go to it, e.g. --gpus 0)
#   bash bench/h100.sh costmodel  # the device rows of the cost model (about 7 min on one GPU):
#                                 # NVML per-call CPU, the memory NVML adds step by step, real
#                                 # fast/slow/rare cycles and publish, the exporter alone idle at
#                                 # 100 ms / 1 s / 10 s per thread (40 s windows), RSS side by
#                                 # side with nvitop-exporter; logs and costmodel.json in $OUT
#   bash bench/h100.sh matrix     # this machine's row of the hardware matrix: the field-values
#                                 # overrun reproduction, tests/hardware, a soak of SOAK_S
#                                 # (600) seconds under CUDA load, then the row as a table
#   bash bench/h100.sh matrix-start; ...; bash bench/h100.sh matrix-wait
#                                 # the same in two parts, for callers limited to 10 minutes a
#                                 # command: the soak runs detached (setsid), matrix-wait
#                                 # collects it (WAIT_S seconds at most, then exit 3)
# Needs on PATH: python3 with nvidia-ml-py, prometheus-client, our dependencies, and for
# "cost" nvitop-exporter (python3 -m nvitop_exporter) and torch for the load (run by the
# machine's python3). With CLEAN=1, "cost" runs both
# exporters (and bench/memory.py) in a virtual environment without the system's
# site-packages, so neither imports what only the machine's image has (uvloop, rich, ...):
# what a container with just the exporter holds. PYTHONPATH must then carry every package.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

load() {  # a CUDA matmul loop in the background, as a training job would be
  python3 - <<'EOF' &
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
end = time.time() + 900
while time.time() < end:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
    time.sleep(0.05)
EOF
  LOAD=$!
  sleep 8
}

case "${1:-}" in
hardware)
  nvidia-smi --query-gpu=name,driver_version,mig.mode.current,power.draw --format=csv
  python3 -c 'import sys, pynvml, prometheus_client; print(sys.version, pynvml.__file__)'
  python3 -m pytest -v -s -p no:cacheprovider tests/hardware 2>&1 | tee "$OUT/hardware.log"
  load
  python3 bench/nvml_calls.py --batch --cycle --n 200 2>&1 | tee "$OUT/nvml_calls.log"
  python3 bench/memory.py --real 2>&1 | tee "$OUT/memory.log"
  python3 bench/scrape_latency.py --real --n 1000 2>&1 | tee "$OUT/scrape_real.log"
  python3 bench/scrape_latency.py --n 1000 2>&1 | tee "$OUT/scrape_fake.log"
  kill "$LOAD"
  ;;
cost)
  PY=python3
  if [ -n "${CLEAN:-}" ]; then
    python3 -m venv --without-pip /tmp/clean && PY=/tmp/clean/bin/python3
  fi
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  [ "${MEMORY:-0}" = 1 ] && $PY bench/memory.py --real 2>&1 | tee "$OUT/memory_clean.log"
  load  # the machine's python3 (torch); a clean environment has none
  $PY bench/cost_table.py compare --window "${WINDOW:-60}" --repeats "${REPEATS:-3}" \
    2>&1 | tee "$OUT/cost.log"
  kill "$LOAD"
  ;;
idle)
  PY=python3
  if [ -n "${CLEAN:-}" ]; then
    python3 -m venv --without-pip /tmp/clean && PY=/tmp/clean/bin/python3
  fi
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  $PY bench/cost_table.py idle --window "${WINDOW:-60}" 2>&1 | tee "$OUT/idle.log"
  ;;
idle-gpus)
  nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv
  python3 bench/cost_model.py --daemon --nvml real --gpus 1,4 --window "${WINDOW:-40}" \
    --intervals "${INTERVALS:-100ms,1s,10s}" 2>&1 | tee "$OUT/idle_gpus.log"
  ;;
energy)
  nvidia-smi --query-gpu=index,name,driver_version,power.draw --format=csv,noheader
  OUT="$OUT" python3 bench/energy_outside.py "${@:2}" 2>&1 | tee "$OUT/energy_outside.log"
  ;;
costmodel)
  PY=python3
  if [ -n "${CLEAN:-}" ]; then
    python3 -m venv --without-pip /tmp/clean && PY=/tmp/clean/bin/python3
  fi
  T0=$SECONDS
  nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv | tee "$OUT/gpus.log"
  $PY bench/cost_table.py versions 2>&1 | tee "$OUT/versions.log"
  $PY bench/nvml_calls.py --batch --cycle --n 100 --json "$OUT/nvml_calls.json" \
    > "$OUT/nvml_calls.log" 2>&1
  tail -n 45 "$OUT/nvml_calls.log"
  $PY bench/nvml_memory.py --json "$OUT/nvml_memory.json" 2>&1 | tee "$OUT/nvml_memory.log"
  $PY bench/cost_model.py --nvml real --calls-json "$OUT/nvml_calls.json" \
    --json "$OUT/cost_model_real.json" 2>&1 | tee "$OUT/cost_model_real.log"
  echo "NVML calls, memory and the real cycles took $((SECONDS - T0)) s"
  $PY bench/cost_table.py model --window "${WINDOW:-40}" --rss-window "${RSS_WINDOW:-30}" \
    --repeats "${REPEATS:-2}" --json "$OUT/cost_model_device.json" > "$OUT/cost_model_device.log" 2>&1
  grep -v '^[0-9-]* [0-9:]* \[' "$OUT/cost_model_device.log"
  $PY bench/cost_table.py summary "$OUT" > "$OUT/costmodel.json"
  echo "costmodel took $((SECONDS - T0)) s; summary in $OUT/costmodel.json"
  ;;
matrix-start)
  DIR=${SOAK_DIR:-/tmp/gpu-exporter-matrix}
  rm -rf "$DIR" && mkdir -p "$DIR"
  nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv | tee "$DIR/gpus.log"
  nvidia-smi topo -m 2>&1 | head -n 12
  [ "${REPRO:-1}" = 1 ] && python3 bench/nvml_field_overrun.py --seconds "${REPRO_S:-10}" \
    --runs 3 2>&1 | tee "$DIR/repro.log"
  python3 -m pytest -v -s -p no:cacheprovider tests/hardware \
    --deselect tests/hardware/test_soak.py::test_soak_under_cuda_load > "$DIR/hardware.log" 2>&1
  tail -n 25 "$DIR/hardware.log"
  SOAK_SECONDS=${SOAK_S:-600} setsid nohup bash -c "python3 -m pytest -v -s \
    -p no:cacheprovider tests/hardware/test_soak.py > $DIR/soak.log 2>&1; echo \$? > $DIR/soak.rc" \
    > /dev/null 2>&1 < /dev/null &
  echo "soak of ${SOAK_S:-600} s started; logs in $DIR"
  ;;
matrix-wait)
  DIR=${SOAK_DIR:-/tmp/gpu-exporter-matrix}
  end=$((SECONDS + ${WAIT_S:-580}))
  while [ ! -f "$DIR/soak.rc" ] && [ $SECONDS -lt $end ]; do sleep 5; done
  cp "$DIR"/*.log "$OUT/" 2>/dev/null
  [ -f "$DIR/soak.rc" ] || { echo "the soak is still running"; exit 3; }
  tail -n 30 "$DIR/soak.log"
  python3 bench/matrix_table.py "$DIR" | tee "$OUT/matrix.md"
  ;;
matrix)
  bash "$0" matrix-start && WAIT_S=100000 bash "$0" matrix-wait
  ;;
*)
  echo "usage: $0 hardware|cost|idle|idle-gpus|energy|costmodel|matrix|matrix-start|matrix-wait" >&2
  exit 2
  ;;
esac
