#!/usr/bin/env bash
# Node 2: join the Ray head with 8 GPUs, then wait until the cluster holds 16.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/env.sh
. "$here/env.sh"

ray start --address="$RAY_HEAD_IP:$RAY_PORT" --num-gpus=8 --disable-usage-stats
for _ in $(seq 60); do
    if ray status --address="$RAY_HEAD_IP:$RAY_PORT" 2>/dev/null | grep -q '16.0 GPU'; then
        echo "cluster ready: 16 GPUs"
        exit 0
    fi
    sleep 5
done
echo "the cluster did not reach 16 GPUs within 5 minutes" >&2
exit 1
