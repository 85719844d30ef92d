// grpojob-probe: the pod sandbox ("pause") process and the test workload of the real test node.
// It has no dependencies, so it builds without the Go module proxy.
module grpojob.dev/testing/probe

go 1.24.0
