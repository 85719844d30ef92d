// Command coredns runs CoreDNS with only the plugins the Corefiles of our test clusters use: the real
// test node's, and the one kubeadm writes on a kind node (which adds prometheus, loop, reload and
// loadbalance).
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// directives lists the linked plugins in the order of CoreDNS's plugin.cfg, which decides the order
// in which a query passes through them.
var directives = []string{
	"reload", "bind", "ready", "health", "prometheus", "errors", "log", "loadbalance", "cache", "kubernetes", "loop", "forward",
}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
