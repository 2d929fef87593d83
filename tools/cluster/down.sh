#!/usr/bin/env bash
# Stop the control plane up.sh started (each process by the pid it recorded, then its session)
# and remove its state directory: certificates, keys, etcd's data, logs, the kubeconfig.
# --keep-state stops the processes and leaves the directory (up.sh uses it after a failed start,
# so the logs stay to read).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
state="${LLMPACK_CLUSTER_DIR:-$(cd "$here/../.." && pwd)/build/cluster}"
keep=0
[[ "${1:-}" == "--keep-state" ]] && keep=1
if [[ -f "$state/pids" ]]; then
    # the reverse of the start order: kwok and the controllers before the API server, etcd last
    mapfile -t lines < <(tac "$state/pids")
    for line in "${lines[@]}"; do
        read -r name pid <<<"$line"
        [[ "$pid" =~ ^[0-9]+$ ]] || continue
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            echo "cluster-down: $name ($pid) ignored SIGTERM for 5 s: SIGKILL" >&2
            kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    rm -f "$state/pids"
fi
if [[ $keep == 0 && -d "$state" ]]; then
    rm -rf "$state"
    echo "cluster-down: stopped; removed $state" >&2
fi
