#!/usr/bin/env bash
# On the Ray head, once both nodes joined: DeepSeek-R1 at TP 8 x PP 2 over the two nodes.
# The flags are checked against vLLM's own argument parser (tests/deploy/test_baremetal.py).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/env.sh
. "$here/env.sh"

args=(
    --served-model-name "$SERVED_NAME"
    --host 0.0.0.0
    --port "$VLLM_PORT"
    --distributed-executor-backend ray
    --tensor-parallel-size 8
    --pipeline-parallel-size 2
    --quantization fp8
    --kv-cache-dtype auto
    --max-model-len 65536
    --gpu-memory-utilization 0.94
    --enable-prefix-caching
    # the cached tokens in usage, and the KV events thinkgate routes by (docs/routing.md)
    --enable-prompt-tokens-details
    --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'
    --enable-chunked-prefill
    --max-num-batched-tokens 8192
    --reasoning-parser deepseek_r1
    --trust-remote-code
)
if [ "${1:-}" = "--print-args" ]; then  # the test reads the flags without starting anything
    printf '%s\n' "${args[@]}"
    exit 0
fi
exec vllm serve "$MODEL" "${args[@]}"
