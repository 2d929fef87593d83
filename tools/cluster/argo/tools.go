//go:build tools

// Package tools pins Argo Workflows' workflow-controller and argoexec, which build.sh --argo
// compiles. A wrapper module of its own: argo-workflows' go.mod has a `replace` line, which
// only the main module's go.mod applies, so it is copied into this go.mod; its k8s.io pins
// differ from the control plane's and the other controllers'.
package tools

import (
	_ "github.com/argoproj/argo-workflows/v3/cmd/argoexec"
	_ "github.com/argoproj/argo-workflows/v3/cmd/workflow-controller"
)
