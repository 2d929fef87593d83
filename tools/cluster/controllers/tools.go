//go:build tools

// Package tools pins the controllers build.sh compiles beside the control plane:
// JobSet's controller manager and Kubeflow Trainer's. They live in a module of
// their own because their k8s.io pins (0.36.2 through Trainer) differ from the
// control plane's (k8s.io/kubernetes v1.36.1 replaces its staging modules by
// 0.36.1); a separate go.sum also keeps the control plane's cache key unchanged.
package tools

import (
	_ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
	_ "sigs.k8s.io/jobset"
)
