//go:build tools

// Package tools pins Kueue's controller manager, which build.sh --kueue compiles. A module of
// its own: Kueue v0.17.0's k8s.io (0.35), controller-runtime (0.23), Trainer (v2.2) and JobSet
// (v0.11) pins differ from the control plane's and from controllers/'s.
package tools

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
