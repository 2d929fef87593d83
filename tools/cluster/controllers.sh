# Sourced by up.sh once the control plane is up (not run on its own): the controllers
# LLMPACK_CLUSTER_CONTROLLERS names, each as a process of its own against the real API server,
# built by build.sh from its own module's pins: JobSet's and Kubeflow Trainer's controller managers
# (`--controllers`, controllers/go.mod), Kueue's (`--kueue`, kueue/go.mod) and Argo Workflows'
# workflow-controller (`--argo`, argo/go.mod). For each, from its pinned module's source in Go's
# module cache:
#   - its CRDs (server-side apply) and its own ClusterRole, bound to the user of a client
#     certificate made here (controllers.py): it runs under its release's RBAC, not as admin;
#   - its webhooks, served by the controller on 127.0.0.1 with a serving certificate signed by the
#     cluster CA (made here; the controllers' own certificate rotation is off, as it manages a
#     Secret for an in-cluster Service), and registered with the API server by URL: the real
#     defaulting and validation webhooks judge JobSets, TrainJobs, runtimes and Kueue's objects
#     (and JobSet's pod webhooks every pod, as in a real install);
#   - leader election on, as in each release (its Lease in its release's namespace, renewed every 2 s:
#     what `llmpack cluster doctor` reads to know it runs); metrics off; health probes on loopback, waited for.
# Trainer also gets its torch-distributed ClusterTrainingRuntime (manifests/base/runtimes), the
# one llmpack's TrainJob names. Kueue runs with its TrainJob and Job integrations. Argo has no
# webhooks: its controller gets its release's ConfigMap and RBAC (kueue/argo sections below).
ctl_go="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
ctl_mod_dir() {  # ctl_mod_dir MODULE [DIR]: MODULE's source folder, as DIR's (default controllers/) go.mod pins it
    (cd "$here/${2:-controllers}" && GOFLAGS=-mod=readonly "$ctl_go" list -m -f '{{.Dir}}' "$1")
}
kubectl=("$bin/kubectl" --kubeconfig "$state/admin.kubeconfig")

hooks="$state/webhooks/k8s-webhook-server/serving-certs"  # controller-runtime's default under $TMPDIR
mkdir -p "$hooks"
cert webhooks "/CN=llmpack-webhooks" "IP:127.0.0.1,DNS:localhost"
cp "$pki/webhooks.crt" "$hooks/tls.crt"
cp "$pki/webhooks.key" "$hooks/tls.key"

ctl_crds() {  # ctl_crds FILE...: server-side apply (the CRDs are too large for apply's annotation), wait Established
    local f n out names=()
    for f in "$@"; do
        out="$("${kubectl[@]}" apply --server-side --force-conflicts -f "$f" -o name)"
        mapfile -t -O "${#names[@]}" names <<<"$out"
    done
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

if want_ctl jobset; then
    jobset_src="$(ctl_mod_dir sigs.k8s.io/jobset)"
    [[ -f "$jobset_src/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml" ]] \
        || die "JobSet's module source not in Go's module cache (make cluster-build)"
    ctl_crds "$jobset_src/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"
    # RBAC before the process starts (its informers list at once); webhooks once it serves them
    "${kubectl[@]}" create --dry-run=client -o json -f "$jobset_src/config/components/rbac/role.yaml" \
        | python3 "$here/controllers.py" --name jobset --port "$jobset_hook" --ca "$pki/ca.crt" \
        | "${kubectl[@]}" apply --server-side -f - >/dev/null
    "${kubectl[@]}" create namespace jobset-system >/dev/null
    "${kubectl[@]}" create --dry-run=client -o json -f "$jobset_src/config/components/rbac/leader_election_role.yaml" \
            -f "$jobset_src/config/components/rbac/leader_election_role_binding.yaml" \
        | python3 "$here/controllers.py" --name jobset --port "$jobset_hook" --ca "$pki/ca.crt" --namespace jobset-system \
        | "${kubectl[@]}" apply --server-side -f - >/dev/null
    cat >"$state/jobset-config.yaml" <<CFG
apiVersion: config.jobset.x-k8s.io/v1alpha1
kind: Configuration
webhook: {port: $jobset_hook, host: 127.0.0.1, certDir: "$hooks"}
health: {healthProbeBindAddress: "127.0.0.1:$jobset_health"}
metrics: {bindAddress: "0"}
leaderElection: {leaderElect: true, resourceNamespace: jobset-system}
internalCertManagement: {enable: false}
CFG
    ctl_start jobset "$jobset_health" "$ctl_bin/jobset" --config "$state/jobset-config.yaml" --zap-log-level info
    ctl_register jobset "$jobset_hook" "$jobset_src/config/components/rbac/role.yaml" \
        "$jobset_src/config/components/webhook/manifests.yaml"
fi

if want_ctl trainer; then
    trainer_src="$(ctl_mod_dir github.com/kubeflow/trainer/v2)"
    [[ -d "$trainer_src/manifests/base/crds" ]] || die "Trainer's module source not in Go's module cache (make cluster-build)"
    ctl_crds "$trainer_src"/manifests/base/crds/trainer.kubeflow.org_*.yaml
    "${kubectl[@]}" create --dry-run=client -o json -f "$trainer_src/manifests/base/rbac/role.yaml" \
        | python3 "$here/controllers.py" --name trainer --port "$trainer_hook" --ca "$pki/ca.crt" \
        | "${kubectl[@]}" apply --server-side -f - >/dev/null
    "${kubectl[@]}" create namespace kubeflow-system >/dev/null  # its Lease's (its ClusterRole allows leases)
    cat >"$state/trainer-config.yaml" <<CFG
apiVersion: config.trainer.kubeflow.org/v1alpha1
kind: Configuration
webhook: {port: $trainer_hook, host: 127.0.0.1}
health: {healthProbeBindAddress: "127.0.0.1:$trainer_health", readinessEndpointName: readyz, livenessEndpointName: healthz}
metrics: {bindAddress: "0"}
leaderElection: {leaderElect: true, resourceName: trainer.kubeflow.org, resourceNamespace: kubeflow-system,
                 leaseDuration: 15s, renewDeadline: 10s, retryPeriod: 2s}
certManagement: {enable: false}
CFG
    ctl_start trainer "$trainer_health" "$ctl_bin/trainer-controller-manager" --config "$state/trainer-config.yaml"
    ctl_register trainer "$trainer_hook" "$trainer_src/manifests/base/rbac/role.yaml" \
        "$trainer_src/manifests/base/webhook/manifests.yaml"
    # the runtime goes through Trainer's validating webhook: retried until the registration is live
    wait_for "Trainer's torch-distributed runtime" 30 \
        "${kubectl[@]}" apply --server-side -f "$trainer_src/manifests/base/runtimes/torch_distributed.yaml"
fi

if want_ctl kueue; then
    kueue_src="$(ctl_mod_dir sigs.k8s.io/kueue kueue)"
    [[ -d "$kueue_src/config/components/crd/bases" ]] || die "Kueue's module source not in Go's module cache (make cluster-build-kueue)"
    # Kueue without its own certificate management reads its metrics serving pair from a fixed
    # path (cmd/kueue/main.go: /etc/kueue/metrics/certs), even with metrics off: it runs in a
    # mount namespace of its own where this cluster's pair is bound there (so two clusters on one
    # machine do not share it). Needs CAP_SYS_ADMIN (root) and that folder as the mount point.
    kueue_metrics=/etc/kueue/metrics/certs
    unshare --mount --propagation private true 2>/dev/null \
        || die "kueue: needs a mount namespace (unshare --mount; root) to give it $kueue_metrics"
    mkdir -p "$kueue_metrics" 2>/dev/null || [[ -d "$kueue_metrics" ]] || die "kueue: cannot make $kueue_metrics"
    mkdir -p "$state/kueue-metrics"
    cp "$pki/webhooks.crt" "$state/kueue-metrics/tls.crt"
    cp "$pki/webhooks.key" "$state/kueue-metrics/tls.key"
    "${kubectl[@]}" create namespace kueue-system >/dev/null
    # its CRDs as its release installs them: the crd component's kustomization adds the
    # conversion webhooks (v1beta1 <-> v1beta2, served by Kueue), registered by URL here
    "${kubectl[@]}" kustomize "$kueue_src/config/components/crd" \
        | "${kubectl[@]}" create --dry-run=client -o json -f - \
        | python3 "$here/controllers.py" --name kueue --port "$kueue_hook" --ca "$pki/ca.crt" >"$state/kueue-crds.json"
    ctl_crds "$state/kueue-crds.json"
    "${kubectl[@]}" create --dry-run=client -o json -f "$kueue_src/config/components/rbac/role.yaml" \
        | python3 "$here/controllers.py" --name kueue --port "$kueue_hook" --ca "$pki/ca.crt" \
        | "${kubectl[@]}" apply --server-side -f - >/dev/null
    # and its Role on Secrets in its namespace (its release binds it to its ServiceAccount)
    "${kubectl[@]}" create --dry-run=client -o json -f "$kueue_src/config/components/rbac/manager_secrets_role.yaml" \
            -f "$kueue_src/config/components/rbac/manager_secrets_role_binding.yaml" \
            -f "$kueue_src/config/components/rbac/leader_election_role.yaml" \
            -f "$kueue_src/config/components/rbac/leader_election_role_binding.yaml" \
        | python3 "$here/controllers.py" --name kueue --port "$kueue_hook" --ca "$pki/ca.crt" --namespace kueue-system \
        | "${kubectl[@]}" apply --server-side -f - >/dev/null
    cat >"$state/kueue-config.yaml" <<CFG
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health: {healthProbeBindAddress: "127.0.0.1:$kueue_health"}
metrics: {bindAddress: "0"}
webhook: {port: $kueue_hook, host: 127.0.0.1, certDir: "$hooks"}
leaderElection: {leaderElect: true, resourceNamespace: kueue-system}
internalCertManagement: {enable: false}
integrations: {frameworks: ["batch/job", "trainer.kubeflow.org/trainjob"]}
CFG
    # batch/job stays on, as in its release's config: with it off, Kueue v0.17.0 still serves its
    # Job webhook (mjob.kb.io) for real instead of a no-op one, without a queue manager, and it
    # panics on every Job created (nil *queue.Manager in DefaultLocalQueueExist,
    # pkg/controller/jobs/job/job_webhook.go:103): JobSet could then make no Job at all.
    # the visibility API (an aggregated API server on a port of its own, VisibilityOnDemand): off
    ctl_start kueue "$kueue_health" unshare --mount --propagation private \
        sh -c 'mount --bind "$1" "$2" && shift 2 && exec "$@"' kueue-mount "$state/kueue-metrics" "$kueue_metrics" \
        "$kueue_bin/kueue" --config "$state/kueue-config.yaml" --feature-gates VisibilityOnDemand=false
    # its release's webhooks: the component's kustomization adds the pod/deployment/statefulset
    # webhooks' namespaceSelector (kube-system and kueue-system left out); its Service is dropped
    "${kubectl[@]}" kustomize "$kueue_src/config/components/webhook" >"$state/kueue-webhooks.yaml"
    ctl_register kueue "$kueue_hook" "$kueue_src/config/components/rbac/role.yaml" "$state/kueue-webhooks.yaml"
fi

if want_ctl argo; then
    # Argo Workflows' workflow-controller as its cluster install runs it (manifests/cluster-install:
    # it watches Workflows in every namespace), in namespace argo. Its CRDs are the full-schema ones
    # (manifests/base/crds/full: the API server validates Workflows against them; the release's
    # cluster install applies the minimal ones), its RBAC the cluster install's Role and ClusterRoles
    # with their bindings repointed at this controller's user, its ConfigMap the release's
    # (manifests/base/workflow-controller, empty) with metrics and telemetry off (their server would
    # bind :9090 on every interface). Its pods' init and wait containers name the executor image
    # quay.io/argoproj/argoexec:<the pin>; a process kubelet runs it from argoexec built here.
    # No webhooks (Argo has none); leader election off (LEADER_ELECTION_DISABLE). Its /healthz is on
    # :6060 of every interface, fixed in cmd/workflow-controller: not used (two clusters would share
    # it); it is ready when its log says its caches are synced (its first "Performing periodic GC").
    argo_src="$(ctl_mod_dir github.com/argoproj/argo-workflows/v3 argo)"
    [[ -d "$argo_src/manifests/base/crds/full" ]] || die "Argo's module source not in Go's module cache (make cluster-build-argo)"
    "${kubectl[@]}" create namespace argo >/dev/null
    ctl_crds "$argo_src"/manifests/base/crds/full/argoproj.io_*.yaml
    "${kubectl[@]}" kustomize "$argo_src/manifests/cluster-install-no-crds/workflow-controller-rbac" \
        | "${kubectl[@]}" create --dry-run=client -o json -f - \
        | python3 "$here/controllers.py" --name argo --port 0 --ca "$pki/ca.crt" --namespace argo \
        | "${kubectl[@]}" apply --server-side -f - >/dev/null
    "${kubectl[@]}" create -n argo -f "$argo_src/manifests/base/workflow-controller/workflow-controller-configmap.yaml" >/dev/null
    "${kubectl[@]}" -n argo patch configmap workflow-controller-configmap --type merge \
        -p '{"data": {"metricsConfig": "enabled: false\n", "telemetryConfig": "enabled: false\n"}}' >/dev/null
    cert argo-controller "/CN=llmpack-argo-controller"
    kubeconfig argo-controller
    start argo-controller env KUBECONFIG="$state/argo-controller.kubeconfig" LEADER_ELECTION_DISABLE=true \
        "$argo_bin/workflow-controller" --namespace argo --configmap workflow-controller-configmap
    wait_for "the argo controller" 60 grep -q "Performing periodic GC" "$state/logs/argo-controller.log"
    # The Argo Server (`argo server`, the same module's cmd/argo): the REST API Hera's WorkflowsService,
    # `llmpack cluster submit argo` and `llmpack cluster compare --argo-host` talk to. --auth-mode client:
    # each request carries a Kubernetes bearer token and acts as that token's user (its own RBAC, the
    # release's argo-server-rbac bound to its certificate's user, covers only its own informers); plain
    # HTTP (--secure=false). It listens on :PORT of EVERY interface (fixed in server/apiserver); the port
    # is a free one, written to argo-server-url. Its UI is the placeholder page (built without the UI).
    # Opt-in (LLMPACK_CLUSTER_CONTROLLERS=...,argo,argo-server): every other listener of cluster-up is loopback-only.
fi
if want_ctl argo-server; then
    "${kubectl[@]}" kustomize "$argo_src/manifests/cluster-install-no-crds/argo-server-rbac" \
        | "${kubectl[@]}" create --dry-run=client -o json -f - \
        | python3 "$here/controllers.py" --name argo-server --port 0 --ca "$pki/ca.crt" --namespace argo \
        | "${kubectl[@]}" apply --server-side -f - >/dev/null
    cert argo-server-controller "/CN=llmpack-argo-server-controller"
    kubeconfig argo-server-controller
    start argo-server env KUBECONFIG="$state/argo-server-controller.kubeconfig" "$argo_bin/argo" server \
        --namespace argo --auth-mode client --secure=false --port "$argo_server_port"
    wait_for "the argo server" 60 curl -sf "http://127.0.0.1:$argo_server_port/"
    echo "http://127.0.0.1:$argo_server_port" >"$state/argo-server-url"
fi
