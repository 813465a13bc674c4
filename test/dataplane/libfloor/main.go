// Command libfloor is the second memory floor BenchmarkHAIdleCPU reports beside the lb pod's
// figures: a Go process built as the lb pod is that links what an lb pod needs besides Kubernetes
// (netlink, nftables, go-iptables, the ARP and NDP packages, the lb pod's pure packages: its
// election, probe, metrics page and the address arithmetic) and does the least of an lb pod's
// idle work with them: it answers HTTP, lists the links every second and decodes a JSON object.
// What it holds no lb pod could go below even with its Kubernetes client, types and watch
// written by hand; what lies between it and the lb pod is those and the lb pod's own state.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	_ "github.com/coreos/go-iptables/iptables"
	_ "github.com/google/nftables"
	_ "github.com/lbsvc/lbsvc-operator/controllers/ipam"
	_ "github.com/lbsvc/lbsvc-operator/lbpod/ha"
	"github.com/lbsvc/lbsvc-operator/lbpod/metric"
	_ "github.com/lbsvc/lbsvc-operator/lbpod/probe"
	_ "github.com/mdlayher/arp"
	_ "github.com/mdlayher/ndp"
	"github.com/vishvananda/netlink"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8090", "where to answer /healthz and /metrics")
	flag.Parse()
	reg := metric.NewRegistry()
	links := metric.NewGauge(metric.Opts{Name: "libfloor_links", Help: "Links seen at the last listing."})
	reg.MustRegister(links)
	go func() {
		for range time.Tick(time.Second) {
			l, err := netlink.LinkList()
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				continue
			}
			var v struct {
				Links int `json:"links"`
			}
			// A JSON round trip, as the lb pod decodes the API's objects.
			b, _ := json.Marshal(map[string]int{"links": len(l)})
			_ = json.Unmarshal(b, &v)
			links.Set(float64(v.Links))
		}
	}()
	http.Handle("/metrics", reg)
	http.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	fmt.Fprintln(os.Stderr, http.ListenAndServe(*addr, nil))
	os.Exit(1)
}
