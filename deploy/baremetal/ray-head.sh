#!/usr/bin/env bash
# Node 1: start the Ray head (8 GPUs). Run before ray-worker.sh on node 2.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/env.sh
. "$here/env.sh"

ray start --head --node-ip-address="$RAY_HEAD_IP" --port="$RAY_PORT" --num-gpus=8 \
    --dashboard-host=127.0.0.1 --disable-usage-stats
