// Command gofloor is the floor BenchmarkHAIdleCPU reports beside the lb pod's figures: a Go process
// built as the lb pod is (same toolchain and flags) that does no more than one part of an lb pod's
// idle work. By default it only answers HTTP, as the lb pod's health and metrics server does: what
// it holds (the runtime, the net/http server and the pages of its own binary) no Go lb pod can go
// below, whatever it leaves out. With --send it sends a 56-byte datagram every --every (an active's
// advert, the simplest way Go does it: a time.Ticker and a UDP socket), with --recv it receives
// them (a standby that wakes for each): the CPU an idle election costs at the least in Go.
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8089", "where to answer /healthz")
	send := flag.String("send", "", "send a datagram to this UDP address every --every (instead of answering HTTP)")
	recv := flag.String("recv", "", "receive datagrams on this UDP address (instead of answering HTTP)")
	every := flag.Duration("every", 100*time.Millisecond, "the sending interval")
	flag.Parse()
	var err error
	switch {
	case *send != "":
		err = sendEvery(*send, *every)
	case *recv != "":
		err = receive(*recv)
	default:
		http.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
		err = http.ListenAndServe(*addr, nil)
	}
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

func sendEvery(to string, every time.Duration) error {
	c, err := net.Dial("udp", to)
	if err != nil {
		return err
	}
	frame := make([]byte, 56)
	for range time.Tick(every) {
		// A refused send (nobody listening yet) is not the floor's concern.
		_, _ = c.Write(frame)
	}
	return nil
}

func receive(on string) error {
	c, err := net.ListenPacket("udp", on)
	if err != nil {
		return err
	}
	buf := make([]byte, 1500)
	for {
		if _, _, err := c.ReadFrom(buf); err != nil {
			return err
		}
	}
}
