#!/usr/bin/env bash
# The CUDA path on a GPU machine, in one run, everything written under $OUT:
#
#   env        the machine, the driver and torch (env.txt)
#   tests      pytest tests/gpu: the attention kernels, the Engine on CUDA at PP = 1 and 2 for
#              the Llama family and every MoE, latent-attention and hybrid family, against
#              transformers and the CPU (tests.log, tests.xml)
#   models     two random-weight checkpoints at real models' shapes by `wavepp make-model`:
#              llama, Llama-3-8B's layers (hidden 4096, 32 / 8 heads of 128, MLP 14336,
#              vocab 128256) cut to $LLAMA_LAYERS layers; moe, a small MoE with MLA
#              (DeepSeek-V2-Lite's shapes: hidden 2048, 16 heads, kv_lora_rank 512, 64 experts
#              of 1408, top 6) cut to $MOE_LAYERS layers (models/, made once, kept)
#   bench      `wavepp bench` on each model at each PP of $PPS, bf16 (bench-<model>-pp<N>.json,
#              .log)
#   roofline   one stage's forward (stage 0 of 2) against the device's best bf16 matmul:
#              benchmarks/stage_roofline.py (roofline-<model>.json, .log)
#
# Every step runs even if one before it failed; summary.json lists each step's exit status,
# and the script exits 1 if any failed. Run from anywhere:
#
#   OUT=/tmp/gpu-check benchmarks/gpu_check.sh
#   STEPS="models bench" PPS=2 benchmarks/gpu_check.sh      # a part of it
#
# Knobs (environment): OUT (default: a new temporary folder), DEVICE (cuda; cpu runs the same
# steps on the CPU, which is how tests/bench/test_gpu_check.py checks the script), STEPS,
# PYTHON (.venv/bin/python), TESTS (tests/gpu), MODELS_DIR ($OUT/models), PPS ("1 2"),
# DTYPE (bfloat16), LLAMA_LAYERS (4), MOE_LAYERS (3), LLAMA_ARGS / MOE_ARGS (make-model's
# arguments, replacing the shapes above), BENCH_ARGS (the workload), ROOFLINE_ARGS.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$(mktemp -d -t wavepp-gpu-check.XXXXXX)}"
DEVICE="${DEVICE:-cuda}"
STEPS="${STEPS:-env tests models bench roofline}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
TESTS="${TESTS:-tests/gpu}"
MODELS_DIR="${MODELS_DIR:-$OUT/models}"
PPS="${PPS:-1 2}"
DTYPE="${DTYPE:-bfloat16}"
LLAMA_LAYERS="${LLAMA_LAYERS:-4}"
MOE_LAYERS="${MOE_LAYERS:-3}"
LLAMA_ARGS="${LLAMA_ARGS:---arch llama --layers $LLAMA_LAYERS --hidden-size 4096 --heads 32 \
--kv-heads 8 --intermediate-size 14336 --vocab-size 128256 --set rope_theta=500000}"
MOE_ARGS="${MOE_ARGS:---arch deepseek_v3 --layers $MOE_LAYERS --hidden-size 2048 --heads 16 \
--intermediate-size 10944 --vocab-size 102400 --set q_lora_rank=0 --set kv_lora_rank=512 \
--set qk_nope_head_dim=128 --set qk_rope_head_dim=64 --set v_head_dim=128 --set num_experts=64 \
--set num_experts_per_tok=6 --set moe_intermediate_size=1408}"
BENCH_ARGS="${BENCH_ARGS:---workload short-suffix,reuse --concurrency 8 --policy wavepp \
--repeat 1 --num-requests 32}"
ROOFLINE_ARGS="${ROOFLINE_ARGS:---pp 2 --stage 0}"
MODELS="llama moe"

mkdir -p "$OUT" "$MODELS_DIR"
SUMMARY="$OUT/summary.tsv"
: >"$SUMMARY"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"

# step NAME LOG COMMAND...: run it with its output in LOG, record its exit status
step() {
    local name="$1" log="$2"
    shift 2
    echo "== $name: $*" | tee -a "$OUT/check.log"
    local start=$SECONDS rc=0
    "$@" >"$log" 2>&1 || rc=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" "$log" >>"$SUMMARY"
    echo "   exit $rc in $((SECONDS - start)) s, log $log" | tee -a "$OUT/check.log"
}

wants() { [[ " $STEPS " == *" $1 "* ]]; }

machine() {
    date -u +%Y-%m-%dT%H:%M:%SZ
    uname -a
    git -C "$ROOT" rev-parse HEAD 2>/dev/null || true
    if command -v nvidia-smi >/dev/null; then nvidia-smi; fi
    "$PYTHON" -c 'import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())
for i in range(torch.cuda.device_count()):
    print(i, torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i))'
}

make_model() {  # make_model NAME ARGS...: the checkpoint, unless it is there already
    local name="$1"
    shift
    if [[ -f "$MODELS_DIR/$name/config.json" ]]; then
        echo "$MODELS_DIR/$name exists: kept"
        return 0
    fi
    "$PYTHON" -m wavepp.cli make-model "$MODELS_DIR/$name" "$@"
}

if wants env; then
    step env "$OUT/env.txt" machine
fi
if wants tests; then
    # shellcheck disable=SC2086  # TESTS is a list of paths
    step tests "$OUT/tests.log" "$PYTHON" -m pytest -q $TESTS --junitxml="$OUT/tests.xml"
fi
if wants models; then
    # shellcheck disable=SC2086  # the arguments are word lists
    step model-llama "$OUT/model-llama.log" make_model llama $LLAMA_ARGS
    # shellcheck disable=SC2086
    step model-moe "$OUT/model-moe.log" make_model moe $MOE_ARGS
fi
if wants bench; then
    for model in $MODELS; do
        for pp in $PPS; do
            # shellcheck disable=SC2086
            step "bench-$model-pp$pp" "$OUT/bench-$model-pp$pp.log" \
                "$PYTHON" -m wavepp.cli bench --model "$MODELS_DIR/$model" --pp "$pp" \
                --device "$DEVICE" --dtype "$DTYPE" $BENCH_ARGS \
                --json "$OUT/bench-$model-pp$pp.json"
        done
    done
fi
if wants roofline; then
    for model in $MODELS; do
        # shellcheck disable=SC2086
        step "roofline-$model" "$OUT/roofline-$model.log" \
            "$PYTHON" "$ROOT/benchmarks/stage_roofline.py" --model "$MODELS_DIR/$model" \
            --device "$DEVICE" $ROOFLINE_ARGS --json "$OUT/roofline-$model.json"
    done
fi

"$PYTHON" - "$SUMMARY" "$OUT/summary.json" "$DEVICE" <<'EOF'
import json, sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
steps = [{"step": n, "exit": int(rc), "seconds": int(s), "log": log} for n, rc, s, log in rows]
json.dump({"device": sys.argv[3], "steps": steps}, open(sys.argv[2], "w"), indent=2)
EOF
echo "wrote $OUT (summary.json)"
if awk -F'\t' '$2 != 0 { bad = 1 } END { exit !bad }' "$SUMMARY"; then
    echo "failed: $(awk -F'\t' '$2 != 0 { printf "%s ", $1 }' "$SUMMARY")" >&2
    exit 1
fi
