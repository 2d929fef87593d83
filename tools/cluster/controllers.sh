# Sourced by up.sh once the control plane is up (not run on its own): the JobSet controller
# manager and, with LLMPACK_CLUSTER_CONTROLLERS=jobset,trainer, Kubeflow Trainer's, built by
# `build.sh --controllers` from controllers/go.mod's pins, each as a process of its own against
# the real API server. For each, from its pinned module's source in Go's module cache:
#   - its CRDs (server-side apply) and its own ClusterRole, bound to the user of a client
#     certificate made here (controllers.py): it runs under its release's RBAC, not as admin;
#   - its webhooks, served by the controller on 127.0.0.1 with a serving certificate signed by the
#     cluster CA (made here; the controllers' own certificate rotation is off, as it manages a
#     Secret for an in-cluster Service), and registered with the API server by URL: the real
#     defaulting and validation webhooks judge JobSets, TrainJobs and runtimes (and JobSet's pod
#     webhooks every pod, as in a real install);
#   - leader election and metrics off; health probes on loopback, waited for.
# Trainer also gets its torch-distributed ClusterTrainingRuntime (manifests/base/runtimes), the
# one llmpack's TrainJob names.
ctl_go="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
ctl_mod_dir() { (cd "$here/controllers" && GOFLAGS=-mod=readonly "$ctl_go" list -m -f '{{.Dir}}' "$1"); }
kubectl=("$bin/kubectl" --kubeconfig "$state/admin.kubeconfig")
jobset_src="$(ctl_mod_dir sigs.k8s.io/jobset)"
[[ -f "$jobset_src/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml" ]] \
    || die "JobSet's module source not in Go's module cache (make cluster-build)"

hooks="$state/webhooks/k8s-webhook-server/serving-certs"  # controller-runtime's default under $TMPDIR
mkdir -p "$hooks"
cert webhooks "/CN=llmpack-webhooks" "IP:127.0.0.1,DNS:localhost"
cp "$pki/webhooks.crt" "$hooks/tls.crt"
cp "$pki/webhooks.key" "$hooks/tls.key"

ctl_crds() {  # ctl_crds FILE...: server-side apply (the CRDs are too large for apply's annotation), wait Established
    local f names=()
    for f in "$@"; do
        "${kubectl[@]}" apply --server-side --force-conflicts -f "$f" >/dev/null
        names+=("crd/$(basename "$f" .yaml | sed 's/^\([^_]*\)_\(.*\)$/\2.\1/')")
    done
    local n
    for n in "${names[@]}"; do wait_for "$n Established" 60 ctl_established "$n"; done
}
ctl_established() {  # ctl_established crd/NAME: its Established condition is True
    [[ $("${kubectl[@]}" get "$1" -o 'jsonpath={.status.conditions[?(@.type=="Established")].status}') == True ]]
}
ctl_start() {  # ctl_start NAME HEALTH_PORT ARGS...: its client certificate, kubeconfig, process, readiness
    local name=$1 health=$2; shift 2
    cert "$name-controller" "/CN=llmpack-$name-controller"
    kubeconfig "$name-controller"
    start "$name-controller" env KUBECONFIG="$state/$name-controller.kubeconfig" TMPDIR="$state/webhooks" "$@"
    wait_for "the $name controller" 60 curl -sf "http://127.0.0.1:$health/readyz"
}
ctl_register() {  # ctl_register NAME PORT ROLE WEBHOOKS: its ClusterRole (bound) and webhooks by URL
    "${kubectl[@]}" create --dry-run=client -o json -f "$3" -f "$4" \
        | python3 "$here/controllers.py" --name "$1" --port "$2" --ca "$pki/ca.crt" \
        | "${kubectl[@]}" apply --server-side -f - >/dev/null
}

ctl_crds "$jobset_src/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"
# RBAC before the process starts (its informers list at once); webhooks once it serves them
"${kubectl[@]}" create --dry-run=client -o json -f "$jobset_src/config/components/rbac/role.yaml" \
    | python3 "$here/controllers.py" --name jobset --port "$jobset_hook" --ca "$pki/ca.crt" \
    | "${kubectl[@]}" apply --server-side -f - >/dev/null
cat >"$state/jobset-config.yaml" <<CFG
apiVersion: config.jobset.x-k8s.io/v1alpha1
kind: Configuration
webhook: {port: $jobset_hook, host: 127.0.0.1, certDir: "$hooks"}
health: {healthProbeBindAddress: "127.0.0.1:$jobset_health"}
metrics: {bindAddress: "0"}
leaderElection: {leaderElect: false}
internalCertManagement: {enable: false}
CFG
ctl_start jobset "$jobset_health" "$ctl_bin/jobset" --config "$state/jobset-config.yaml" --zap-log-level info
ctl_register jobset "$jobset_hook" "$jobset_src/config/components/rbac/role.yaml" \
    "$jobset_src/config/components/webhook/manifests.yaml"

if [[ ",$controllers," == *,trainer,* ]]; then
    trainer_src="$(ctl_mod_dir github.com/kubeflow/trainer/v2)"
    [[ -d "$trainer_src/manifests/base/crds" ]] || die "Trainer's module source not in Go's module cache (make cluster-build)"
    ctl_crds "$trainer_src"/manifests/base/crds/trainer.kubeflow.org_*.yaml
    "${kubectl[@]}" create --dry-run=client -o json -f "$trainer_src/manifests/base/rbac/role.yaml" \
        | python3 "$here/controllers.py" --name trainer --port "$trainer_hook" --ca "$pki/ca.crt" \
        | "${kubectl[@]}" apply --server-side -f - >/dev/null
    cat >"$state/trainer-config.yaml" <<CFG
apiVersion: config.trainer.kubeflow.org/v1alpha1
kind: Configuration
webhook: {port: $trainer_hook, host: 127.0.0.1}
health: {healthProbeBindAddress: "127.0.0.1:$trainer_health", readinessEndpointName: readyz, livenessEndpointName: healthz}
metrics: {bindAddress: "0"}
leaderElection: {leaderElect: false}
certManagement: {enable: false}
CFG
    ctl_start trainer "$trainer_health" "$ctl_bin/trainer-controller-manager" --config "$state/trainer-config.yaml"
    ctl_register trainer "$trainer_hook" "$trainer_src/manifests/base/rbac/role.yaml" \
        "$trainer_src/manifests/base/webhook/manifests.yaml"
    # the runtime goes through Trainer's validating webhook: retried until the registration is live
    wait_for "Trainer's torch-distributed runtime" 30 \
        "${kubectl[@]}" apply --server-side -f "$trainer_src/manifests/base/runtimes/torch_distributed.yaml"
fi
