// Command pause is the pod sandbox's first process: it does nothing but reap orphaned children
// (it is PID 1 of the pod) and exit cleanly on SIGINT or SIGTERM. The demo cluster builds it
// because no registry can be reached to pull the usual pause image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 8)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
