// Command loopdriver runs lbpod.Loop the way a failover controller will: it starts the loop as a
// standby or active, reads "active" and "standby" lines on stdin and calls SetActive ("confirmed"
// and "unconfirmed" set what LoopConfig.Confirmed says, as an election that stops confirming its
// role would), and prints "held true" / "held false" each time OnHeld reports a change. The data-path tests use it to
// check the failover seam from outside (network namespaces are per process, so the loop cannot
// run inside the test binary).
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/lbsvc/lbsvc-operator/lbpod"
)

func main() {
	var addresses, gateways, subnets, serviceFile, healthAddr string
	var standby bool
	var announce, lifetime, resync time.Duration
	flag.StringVar(&addresses, "addresses", "", "LB address(es) with prefix length")
	flag.StringVar(&gateways, "gateways", "", "subnet gateway(s)")
	flag.StringVar(&subnets, "subnets", "", "subnet CIDR(s)")
	flag.StringVar(&serviceFile, "service-file", "", "the Service, read once")
	flag.StringVar(&healthAddr, "health-addr", "127.0.0.1:8081", "health server")
	flag.BoolVar(&standby, "standby", false, "start as a standby")
	flag.DurationVar(&announce, "announce-interval", 30*time.Second, "periodic announcements")
	flag.DurationVar(&lifetime, "lifetime", 0, "kernel lifetime of the LB addresses, as with standbys (LoopConfig.AddressLifetime; 0: for ever); nothing renews it")
	flag.DurationVar(&resync, "resync-period", 10*time.Second, "the loop's resync period")
	flag.Parse()
	if err := run(addresses, gateways, subnets, serviceFile, healthAddr, standby, announce, lifetime, resync); err != nil {
		fmt.Fprintln(os.Stderr, "loopdriver:", err)
		os.Exit(1)
	}
}

func run(addresses, gateways, subnets, serviceFile, healthAddr string, standby bool, announce, lifetime, resync time.Duration) error {
	network, err := lbpod.ParseNetwork(addresses, gateways, subnets)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(serviceFile)
	if err != nil {
		return err
	}
	svc := &corev1.Service{}
	if err := yaml.Unmarshal(data, svc); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	paths, _ := lbpod.DetectIPTables(ctx)
	applier, err := lbpod.NewApplier(paths, log)
	if err != nil {
		return err
	}
	var unconfirmed atomic.Bool
	loop := lbpod.NewLoop(lbpod.LoopConfig{
		Network: network, Applier: applier, ResyncPeriod: resync, AnnounceInterval: announce, Log: log,
		OnHeld:          func(held bool) { fmt.Printf("held %t\n", held) },
		AddressLifetime: func() time.Duration { return lifetime },
		Confirmed:       func() bool { return !unconfirmed.Load() },
	})
	loop.SetActive(!standby)
	srv, err := lbpod.ServeHealth(healthAddr, loop.Handler(), nil, log)
	if err != nil {
		return err
	}
	defer srv.Close()
	loop.SetService(svc, nil)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			switch sc.Text() {
			case "active":
				loop.SetActive(true)
			case "standby":
				loop.SetActive(false)
			case "confirmed", "unconfirmed":
				unconfirmed.Store(sc.Text() == "unconfirmed")
			}
		}
	}()
	return loop.Run(ctx)
}
