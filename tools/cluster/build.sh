#!/usr/bin/env bash
# Build the real control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok) from the modules pinned in go.mod, into a cache
# directory outside the repository keyed by the pins: a second run with the same
# go.mod/go.sum reuses it. Prints the bin directory on stdout, nothing else.
# Nothing prebuilt is downloaded: the Go module proxy serves sources only.
# --cached: print the bin directory if it is built, else exit 1 (builds nothing).
# --fetch: only download the modules the build needs into Go's module cache (network, little CPU: CI runs it
#   beside the Python tiers so that the build later only compiles); nothing when the set is built already.
# One of these builds another set instead, each from a module of its own (their k8s.io and
# controller-runtime pins differ from the control plane's and from one another's), into a cache
# directory keyed by that module's pins the same way:
# --controllers: the JobSet and Kubeflow Trainer controller managers (controllers/go.mod);
# --kueue: Kueue's controller manager (kueue/go.mod);
# --argo: Argo Workflows' workflow-controller, argoexec and the argo CLI (`argo server`: the REST API
#   Hera and `llmpack cluster compare` submit to), from argo/go.mod, a wrapper module carrying
#   argo-workflows' own `replace` lines.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cached=0 fetch=0 set=control-plane
for arg in "$@"; do
    case "$arg" in
        --cached) cached=1 ;;
        --fetch) fetch=1 ;;
        --controllers) set=controllers ;;
        --kueue) set=kueue ;;
        --argo) set=argo ;;
        *) echo "cluster-build: unknown argument '$arg' (--cached, --fetch, --controllers, --kueue, --argo)" >&2; exit 2 ;;
    esac
done
go_bin="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
if [[ ! -x "$go_bin" ]]; then
    echo "cluster-build: no Go toolchain (set GO=/path/to/go or put go on PATH)" >&2
    exit 2
fi
cache="${LLMPACK_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmpack-cluster}"
if [[ $set != control-plane ]]; then
    case $set in
        controllers) mod="$here/controllers" cmds=(jobset trainer-controller-manager)
            pkgs=(sigs.k8s.io/jobset github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager) ;;
        kueue) mod="$here/kueue" cmds=(kueue) pkgs=(sigs.k8s.io/kueue/cmd/kueue) ;;
        argo) mod="$here/argo" cmds=(workflow-controller argoexec argo)
            pkgs=(github.com/argoproj/argo-workflows/v3/cmd/workflow-controller
                  github.com/argoproj/argo-workflows/v3/cmd/argoexec
                  github.com/argoproj/argo-workflows/v3/cmd/argo) ;;
    esac
    ldflags="-s -w"
    # Argo's binaries report the pinned release (the controller's default executor image tag too)
    [[ $set != argo ]] || ldflags+=" -X github.com/argoproj/argo-workflows/v3.version=$(awk \
        '{for (i = 1; i < NF; i++) if ($i == "github.com/argoproj/argo-workflows/v3") {print $(i + 1); exit}}' "$mod/go.mod")"
    key="$( (cat "$mod/go.mod" "$mod/go.sum"; echo "${pkgs[*]} $ldflags") | sha256sum | cut -c1-16)"
    bin="$cache/$set-$key/bin"
    have_all=1
    for c in "${cmds[@]}"; do [[ -x "$bin/$c" ]] || have_all=0; done
    if [[ $have_all == 1 ]]; then
        [[ $cached == 1 ]] || echo "cluster-build: $set cached in $bin" >&2
        echo "$bin"
        exit 0
    fi
    if [[ $cached == 1 ]]; then
        echo "cluster-build: $set not built yet for these pins (make cluster-build)" >&2
        exit 1
    fi
    if [[ $fetch == 1 ]]; then  # the modules of every package the build compiles (errors are the build's to tell)
        (cd "$mod" && GOFLAGS=-mod=readonly "$go_bin" list -e -deps "${pkgs[@]}" >/dev/null)
        exit 0
    fi
    tmp="$bin.partial"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    echo "cluster-build: compiling ${cmds[*]} into $bin (cold: minutes on 2 cores)" >&2
    start=$SECONDS
    modfile=()
    if [[ $set == argo ]]; then
        # The module zip the proxy serves lacks workflow/executor/osspecific/signal_linux.go: in the
        # repository it is a symlink to signal_darwin.go, and module zips leave symlinks out, so
        # argoexec does not build for linux from the module as served (undefined: Setpgid). Built
        # from a copy of the module source with that file restored, by a replace in a go.mod made
        # here (-modfile): the pinned go.mod/go.sum are left as they are.
        src="$(cd "$mod" && GOFLAGS=-mod=readonly "$go_bin" mod download -json github.com/argoproj/argo-workflows/v3 \
            | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')"
        work="$cache/$set-$key/src"
        rm -rf "$work"
        mkdir -p "$work"
        cp -r "$src" "$work/argo-workflows"
        chmod -R u+w "$work/argo-workflows"
        os_dir="$work/argo-workflows/workflow/executor/osspecific"
        [[ -e "$os_dir/signal_linux.go" ]] || cp "$os_dir/signal_darwin.go" "$os_dir/signal_linux.go"
        # `argo server` embeds the UI's built files (ui/dist/app, made by yarn, not in the module): built
        # without them, as Argo's own Makefile does with STATIC_FILES=false (a placeholder index.html).
        mkdir -p "$work/argo-workflows/ui/dist/app"
        [[ -e "$work/argo-workflows/ui/dist/app/index.html" ]] \
            || echo "Argo Workflows UI: built without static files" >"$work/argo-workflows/ui/dist/app/index.html"
        cp "$mod/go.mod" "$work/go.mod"
        cp "$mod/go.sum" "$work/go.sum"
        echo "replace github.com/argoproj/argo-workflows/v3 => $work/argo-workflows" >>"$work/go.mod"
        modfile=(-modfile "$work/go.mod")
    fi
    (cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=readonly "$go_bin" build "${modfile[@]}" -trimpath -ldflags="$ldflags" \
        -o "$tmp/" "${pkgs[@]}")
    [[ $set != argo ]] || rm -rf "$work"
    for c in "${cmds[@]}"; do
        [[ -x "$tmp/$c" ]] || { echo "cluster-build: $c was not built" >&2; exit 1; }
    done
    rm -rf "$bin"
    mv "$tmp" "$bin"
    echo "cluster-build: $set built in $((SECONDS - start)) s" >&2
    echo "$bin"
    exit 0
fi
# What is built, by command name and package; the cache key covers it and the pins.
cmds=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kubectl)
pkgs=(go.etcd.io/etcd/server/v3 k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
      k8s.io/kubernetes/cmd/kube-scheduler sigs.k8s.io/kwok/cmd/kwok k8s.io/kubernetes/cmd/kubectl)
# The binaries report the pinned release (kubectl's skew warning, clients that read /version),
# as Kubernetes' own build stamps it (hack/lib/version.sh).
k8s_version="$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$here/go.mod")"
[[ "$k8s_version" =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+$ ]] || { echo "cluster-build: no k8s.io/kubernetes release in go.mod" >&2; exit 2; }
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$k8s_version -X $p.gitMajor=${BASH_REMATCH[1]} -X $p.gitMinor=${BASH_REMATCH[2]}"
    ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
key="$( (cat "$here/go.mod" "$here/go.sum"; echo "${pkgs[*]} $ldflags") | sha256sum | cut -c1-16)"
bin="$cache/$key/bin"
# The CRDs the tests install come from pinned modules' source (crds.json): into Go's module
# cache here, so that the tests read them offline.
download_crd_modules() {
    python3 - "$here/crds.json" <<'PY' | while read -r mv; do
import json, sys
for name, pin in json.load(open(sys.argv[1])).items():
    if not name.startswith("_"):
        print(f"{pin['module']}@{pin['version']}")
PY
        (cd "${TMPDIR:-/tmp}" && GOFLAGS= "$go_bin" mod download "$mv") || { echo "cluster-build: could not download $mv" >&2; exit 1; }
    done
}
have_all=1
for c in "${cmds[@]}"; do [[ -x "$bin/$c" ]] || have_all=0; done
if [[ $have_all == 1 ]]; then
    if [[ $cached == 0 ]]; then
        download_crd_modules
        echo "cluster-build: cached in $bin" >&2
    fi
    echo "$bin"
    exit 0
fi
if [[ $cached == 1 ]]; then
    echo "cluster-build: not built yet for these pins (make cluster-build)" >&2
    exit 1
fi
if [[ $fetch == 1 ]]; then
    (cd "$here" && GOFLAGS=-mod=readonly "$go_bin" list -e -deps "${pkgs[@]}" >/dev/null)
    download_crd_modules
    exit 0
fi
tmp="$cache/$key/bin.partial"
rm -rf "$tmp"
mkdir -p "$tmp"
echo "cluster-build: compiling ${cmds[*]} into $bin (cold: tens of minutes on 2 cores)" >&2
start=$SECONDS
# One go build for every command: the packages they share compile once.
(cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=readonly "$go_bin" build -trimpath -ldflags="$ldflags" -o "$tmp/" "${pkgs[@]}")
# etcd's main package is named after its module directory.
[[ -x "$tmp/v3" ]] && mv "$tmp/v3" "$tmp/etcd"
[[ -x "$tmp/server" ]] && mv "$tmp/server" "$tmp/etcd"
for c in "${cmds[@]}"; do
    [[ -x "$tmp/$c" ]] || { echo "cluster-build: $c was not built" >&2; exit 1; }
done
rm -rf "$bin"
mv "$tmp" "$bin"
download_crd_modules
echo "cluster-build: built in $((SECONDS - start)) s" >&2
echo "$bin"
