#!/usr/bin/env bash
# Start a real Kubernetes control plane on loopback: etcd, kube-apiserver (TLS, RBAC, the default
# admission plugins with PodSecurity/ResourceQuota/LimitRanger), kube-controller-manager,
# kube-scheduler and kwok playing the kubelets of simulated GPU nodes. Binaries come from
# build.sh (built from the pinned modules on first use). Everything it makes lives in the state
# directory ($LLMPACK_CLUSTER_DIR, default build/cluster): certificates and keys made here with
# openssl, etcd's data, logs, pids and the kubeconfig written for the user. down.sh removes it.
# etcd speaks TLS only and wants a client certificate of its own CA (etcd-ca, not the cluster's: the
# controller-manager signs CSRs with that one), which only the API server holds: no local user reads
# Secrets from etcd around the API server's TLS and RBAC.
#
# Settings (environment):
#   LLMPACK_CLUSTER_DIR    state directory (default <repo>/build/cluster)
#   LLMPACK_CLUSTER_NODES  node-group JSON (default tools/cluster/nodes.json; see nodes.py)
#   LLMPACK_KWOK_POD_DELAY_MS   kwok's base delay of each pod stage (default 1000; kwok's own);
#                          one pod sets its own with both annotations <stage>.stage.kwok.x-k8s.io/delay and
#                          .../jitter-delay (kwok reads the jitter as the delay's upper bound: give jitter-delay >= delay)
#   LLMPACK_KWOK_POD_JITTER_MS  the stages' random extra delay, at most (default 0: repeatable); each stage
#                          waits DELAY + uniform(0, JITTER) (kwok's jitterDurationMilliseconds is written DELAY+JITTER)
#   LLMPACK_CLUSTER_API_QPS  the controller-manager's and scheduler's client rate (queries/s; burst
#                          twice that), for scale runs (default: theirs, 20 and 50)
#   LLMPACK_CLUSTER_WATCH_CACHE  0: the API server serves watches from etcd, not its watch cache
#                          (a watch from a compacted revision then gets 410 Gone, as etcd answers)
#   LLMPACK_CLUSTER_CONTROLLERS  controllers to run beside the control plane, comma-separated:
#                          jobset, trainer (needs jobset), kueue (needs jobset,trainer: its TrainJob
#                          integration), argo, or none (the default; make cluster-up passes
#                          jobset,trainer). Each gets its pinned module's CRDs, RBAC and webhooks
#                          (served on loopback with a certificate made here); see controllers.sh.
# Prints `export KUBECONFIG=...` on stdout when the control plane answers /readyz and kwok has
# made every node Ready.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
state="${LLMPACK_CLUSTER_DIR:-$repo/build/cluster}"
nodes_file="${LLMPACK_CLUSTER_NODES:-$here/nodes.json}"
delay_ms="${LLMPACK_KWOK_POD_DELAY_MS:-1000}"
jitter_ms="${LLMPACK_KWOK_POD_JITTER_MS:-0}"
t0=$(date +%s.%N)

die() { echo "cluster-up: $*" >&2; exit 2; }
[[ "$delay_ms" =~ ^[0-9]{1,7}$ ]] || die "LLMPACK_KWOK_POD_DELAY_MS '$delay_ms': not a number of milliseconds"
[[ "$jitter_ms" =~ ^[0-9]{1,7}$ ]] || die "LLMPACK_KWOK_POD_JITTER_MS '$jitter_ms': not a number of milliseconds"
api_qps="${LLMPACK_CLUSTER_API_QPS:-}"
[[ -z "$api_qps" || "$api_qps" =~ ^[0-9]{1,5}$ ]] || die "LLMPACK_CLUSTER_API_QPS '$api_qps': not a number of queries a second"
watch_cache="${LLMPACK_CLUSTER_WATCH_CACHE:-1}"
[[ "$watch_cache" == 0 || "$watch_cache" == 1 ]] || die "LLMPACK_CLUSTER_WATCH_CACHE '$watch_cache': 0 or 1"
controllers="${LLMPACK_CLUSTER_CONTROLLERS:-none}"
want_ctl() { [[ ",$controllers," == *",$1,"* ]]; }
if [[ $controllers != none ]]; then
    bad=""
    IFS=, read -ra ctl_list <<<"$controllers"
    for c in "${ctl_list[@]}"; do
        case "$c" in jobset|trainer|kueue|argo|argo-server) ;; *) bad=1 ;; esac
    done
    want_ctl trainer && ! want_ctl jobset && bad=1
    want_ctl kueue && ! want_ctl trainer && bad=1
    want_ctl argo-server && ! want_ctl argo && bad=1
    [[ -z $bad && ${#ctl_list[@]} -gt 0 ]] \
        || die "LLMPACK_CLUSTER_CONTROLLERS '$controllers': none, or a comma-separated set of jobset, trainer (needs jobset), kueue (needs jobset,trainer), argo, argo-server (needs argo; listens on every interface)"
fi
[[ -f "$nodes_file" ]] || die "LLMPACK_CLUSTER_NODES '$nodes_file': no such file"
python3 "$here/nodes.py" --print "$nodes_file" >/dev/null || exit 2
for tool in openssl curl python3; do
    command -v "$tool" >/dev/null || die "needs $tool on PATH"
done
if [[ -f "$state/pids" ]]; then
    die "a control plane is already up in $state (make cluster-down first)"
fi

bin="$("$here/build.sh")"
! want_ctl jobset || ctl_bin="$("$here/build.sh" --controllers)"
! want_ctl kueue || kueue_bin="$("$here/build.sh" --kueue)"
! want_ctl argo || argo_bin="$("$here/build.sh" --argo)"
mkdir -p "$state"/{pki,logs,etcd}
chmod 700 "$state"
pki="$state/pki"
: >"$state/pids"

# --------------------------------------------------------------------------- ports: free ones, loopback only
read -r etcd_port peer_port api_port kcm_port sched_port kwok_port jobset_hook jobset_health trainer_hook \
    trainer_health kueue_hook kueue_health argo_health argo_server_port < <(python3 - <<'EOF'
import socket
socks = [socket.socket() for _ in range(14)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
for s in socks:
    s.close()
EOF
)
server="https://127.0.0.1:$api_port"

# --------------------------------------------------------------------------- certificates and keys
cert() {  # cert NAME SUBJECT [SAN [CA]]: a key and a certificate signed by the cluster CA (or CA: etcd-ca)
    local name=$1 subj=$2 san=${3:-} ca=${4:-ca}
    openssl ecparam -name prime256v1 -genkey -noout -out "$pki/$name.key" 2>/dev/null
    openssl req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
    local ext="$pki/$name.ext"
    if [[ -n $san ]]; then
        printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=%s\n' "$san" >"$ext"
    else
        printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >"$ext"
    fi
    openssl x509 -req -in "$pki/$name.csr" -CA "$pki/$ca.crt" -CAkey "$pki/$ca.key" -CAcreateserial \
        -days 30 -sha256 -extfile "$ext" -out "$pki/$name.crt" 2>/dev/null
    rm -f "$pki/$name.csr" "$ext"
}
ca() {  # ca NAME CN: a self-signed CA
    openssl ecparam -name prime256v1 -genkey -noout -out "$pki/$1.key" 2>/dev/null
    openssl req -x509 -new -key "$pki/$1.key" -subj "/CN=$2" -days 30 -sha256 \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
        -out "$pki/$1.crt" 2>/dev/null
}
ca ca llmpack-cluster-ca
ca etcd-ca llmpack-etcd-ca
# etcd's serving (and peer) certificate, and the API server's client certificate to etcd
cert etcd-server "/CN=etcd" "IP:127.0.0.1,DNS:localhost" etcd-ca
cert apiserver-etcd-client "/CN=kube-apiserver-etcd-client" "" etcd-ca
cert apiserver "/CN=kube-apiserver" \
    "IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
cert admin "/O=system:masters/CN=llmpack-admin"
cert controller-manager "/CN=system:kube-controller-manager"
cert scheduler "/CN=system:kube-scheduler"
cert kwok "/O=system:masters/CN=kwok-controller"
openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
chmod 600 "$pki"/*.key

kubeconfig() {  # kubeconfig NAME: a kubeconfig for the client certificate NAME
    cat >"$state/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: llmpack
  cluster: {server: "$server", certificate-authority: "$pki/ca.crt"}
users:
- name: $1
  user: {client-certificate: "$pki/$1.crt", client-key: "$pki/$1.key"}
contexts:
- name: llmpack
  context: {cluster: llmpack, user: $1}
current-context: llmpack
EOF
    chmod 600 "$state/$1.kubeconfig"
}
for who in admin controller-manager scheduler kwok; do kubeconfig "$who"; done
cp "$state/admin.kubeconfig" "$state/kubeconfig"

# --------------------------------------------------------------------------- kwok's stages, from the pinned module
kwok_dir="$(cd "$here" && GOFLAGS=-mod=readonly "${GO:-$(command -v go || echo /usr/local/go/bin/go)}" list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
[[ -f "$kwok_dir/kustomize/stage/pod/general/pod-ready.yaml" ]] || die "kwok's module source not in Go's module cache (make cluster-build)"
{
    for f in "$kwok_dir"/kustomize/stage/node/fast/node-initialize.yaml \
             "$kwok_dir"/kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml; do
        echo "---"
        cat "$f"
    done
    # kwok's general pod stages (each waits DELAY + uniform(0, JITTER): kwok's jitter is the delay's upper bound, so
    # its jitterDurationMilliseconds is DELAY+JITTER; a jitter at or below the delay would replace the delay) and
    # its chaos stage that fails the containers of a pod labelled
    # pod-container-running-failed.stage.kwok.x-k8s.io=true (exit code by annotation)
    for f in "$kwok_dir"/kustomize/stage/pod/general/pod-*.yaml \
             "$kwok_dir"/kustomize/stage/pod/chaos/pod-container-running-failed.yaml; do
        echo "---"
        sed -E -e "s/^    durationMilliseconds: [0-9]+$/    durationMilliseconds: $delay_ms/" \
            -e "s/^    jitterDurationMilliseconds: [0-9]+$/    jitterDurationMilliseconds: $((delay_ms + jitter_ms))/" "$f"
    done
} >"$state/kwok.yaml"

# --------------------------------------------------------------------------- processes
start() {  # start NAME ARGS...: in its own session, logging to logs/NAME.log
    local name=$1; shift
    setsid "$@" >"$state/logs/$name.log" 2>&1 </dev/null &
    echo "$name $!" >>"$state/pids"
}
wait_for() {  # wait_for WHAT SECONDS CMD...: poll CMD until it succeeds
    local what=$1 limit=$2; shift 2
    local end=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= end)); then
            echo "cluster-up: $what not ready after ${limit} s; logs in $state/logs (tail below)" >&2
            tail -n 15 "$state"/logs/*.log >&2 || true
            "$here/down.sh" --keep-state >/dev/null 2>&1 || true
            exit 1
        fi
        sleep 0.2
    done
}
api() { curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "$server$1"; }

# TLS with client certificates of etcd-ca on the client and the peer URL (unexercised on a live cluster when
# written: issue 46, item 12; tests/test_cluster_tools.py checks the flags and the certificates)
start etcd "$bin/etcd" --name llmpack --data-dir "$state/etcd" \
    --listen-client-urls "https://127.0.0.1:$etcd_port" --advertise-client-urls "https://127.0.0.1:$etcd_port" \
    --cert-file "$pki/etcd-server.crt" --key-file "$pki/etcd-server.key" \
    --client-cert-auth --trusted-ca-file "$pki/etcd-ca.crt" \
    --listen-peer-urls "https://127.0.0.1:$peer_port" --initial-advertise-peer-urls "https://127.0.0.1:$peer_port" \
    --peer-cert-file "$pki/etcd-server.crt" --peer-key-file "$pki/etcd-server.key" \
    --peer-client-cert-auth --peer-trusted-ca-file "$pki/etcd-ca.crt" \
    --initial-cluster "llmpack=https://127.0.0.1:$peer_port" --listen-metrics-urls "" \
    --unsafe-no-fsync --quota-backend-bytes 4294967296 --log-level warn
etcd_tls=(--cacert "$pki/etcd-ca.crt" --cert "$pki/apiserver-etcd-client.crt" --key "$pki/apiserver-etcd-client.key")
wait_for etcd 20 curl -sf "${etcd_tls[@]}" "https://127.0.0.1:$etcd_port/health"
echo "https://127.0.0.1:$etcd_port" >"$state/etcd-url"  # for tests that compact it (with the client pair in pki/)

start kube-apiserver "$bin/kube-apiserver" \
    --etcd-servers "https://127.0.0.1:$etcd_port" \
    --etcd-cafile "$pki/etcd-ca.crt" --etcd-certfile "$pki/apiserver-etcd-client.crt" \
    --etcd-keyfile "$pki/apiserver-etcd-client.key" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range 10.96.0.0/16 \
    --authorization-mode Node,RBAC \
    --enable-admission-plugins NodeRestriction,PodSecurity,ResourceQuota,LimitRanger \
    --allow-privileged=false --profiling=false --endpoint-reconciler-type none \
    --watch-cache="$([[ $watch_cache == 1 ]] && echo true || echo false)"
qps_flags=()
[[ -z "$api_qps" ]] || qps_flags=(--kube-api-qps "$api_qps" --kube-api-burst "$((api_qps * 2))")
wait_for kube-apiserver 45 api /readyz

start kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig "$state/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$state/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$state/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$kcm_port" --leader-elect=false \
    --use-service-account-credentials --root-ca-file "$pki/ca.crt" \
    --service-account-private-key-file "$pki/sa.key" \
    --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
    --profiling=false "${qps_flags[@]}"
start kube-scheduler "$bin/kube-scheduler" \
    --kubeconfig "$state/scheduler.kubeconfig" \
    --authentication-kubeconfig "$state/scheduler.kubeconfig" \
    --authorization-kubeconfig "$state/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$sched_port" --leader-elect=false --profiling=false "${qps_flags[@]}"
start kwok "$bin/kwok" --kubeconfig "$state/kwok.kubeconfig" --config "$state/kwok.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --node-ip 127.0.0.1 --server-address "127.0.0.1:$kwok_port" --node-lease-duration-seconds 40 \
    --cidr 10.244.0.0/16

python3 "$here/nodes.py" "$nodes_file" --server "$server" --ca "$pki/ca.crt" \
    --cert "$pki/admin.crt" --key "$pki/admin.key"
want=$(python3 "$here/nodes.py" --print "$nodes_file" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
nodes_ready() {
    [[ $(api /api/v1/nodes | python3 -c 'import json,sys
items = json.load(sys.stdin)["items"]
print(sum(any(c["type"] == "Ready" and c["status"] == "True" for c in (n.get("status") or {}).get("conditions") or []) for n in items))') -ge $want ]]
}
# the controller-manager makes each namespace's default ServiceAccount: pods need it
default_sa() { api /api/v1/namespaces/default/serviceaccounts/default; }
wait_for "kwok's nodes" $((30 + want / 20)) nodes_ready
wait_for "the controller-manager" 30 default_sa
wait_for kube-scheduler 20 curl -sfk "https://127.0.0.1:$sched_port/healthz"

if [[ $controllers != none ]]; then
    # shellcheck source=controllers.sh
    source "$here/controllers.sh"
fi

t1=$(date +%s.%N)
echo "cluster-up: $server up in $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s ($want nodes; controllers: $controllers); state in $state" >&2
echo "export KUBECONFIG=$state/kubeconfig"
