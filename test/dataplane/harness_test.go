//go:build dataplane

// Package dataplane runs the real lbpod binary in network namespaces built per test and checks
// the data path with real traffic. Run as root: go test -tags dataplane -p 1 ./test/dataplane/...
package dataplane

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// lbpodBin is the binary under test, built once by TestMain (or given as LBPOD_BIN); loopDriverBin
// runs lbpod.Loop with SetActive driven from stdin (test/dataplane/loopdriver).
var lbpodBin, loopDriverBin string

// nonftBin runs a command without nf_tables (test/dataplane/nonft), built once by TestMain.
var nonftBin string

// goFloorBin is the memory floor of a Go process answering HTTP (test/dataplane/gofloor), built
// once by TestMain as lbpodBin is.
var goFloorBin string

// libFloorBin is the memory floor of a Go process that links the lb pod's libraries but not
// Kubernetes' (test/dataplane/libfloor), built alike.
var libFloorBin string

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "dataplane tests need root (network namespaces, iptables)")
		os.Exit(1)
	}
	for _, tool := range []string{"ip", "iptables", "ip6tables", "iptables-save", "ip6tables-save"} {
		if _, err := exec.LookPath(tool); err != nil {
			fmt.Fprintf(os.Stderr, "dataplane tests need %s (Debian package iproute2 / iptables): %v\n", tool, err)
			os.Exit(1)
		}
	}
	sweepOrphans()
	dir, err := os.MkdirTemp("", "lbpod-dataplane-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// nonft runs lbpod where nf_tables cannot be reached (the fallback tests).
	for bin, pkg := range map[*string]string{&lbpodBin: "cmd/lbpod", &loopDriverBin: "test/dataplane/loopdriver", &nonftBin: "test/dataplane/nonft", &goFloorBin: "test/dataplane/gofloor", &libFloorBin: "test/dataplane/libfloor"} {
		*bin = filepath.Join(dir, filepath.Base(pkg))
		// Built as the image builds them (hack/images.sh): the tests run what ships, and the
		// memory figures compare binaries built alike.
		build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", *bin, "github.com/lbsvc/lbsvc-operator/"+pkg)
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build %s: %v\n%s", pkg, err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	// LBPOD_BIN: test a prebuilt lbpod instead (the image's stripped build, another commit's).
	if bin := os.Getenv("LBPOD_BIN"); bin != "" {
		lbpodBin = bin
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Addresses of the topology. The underlay is the seed's 172.18.0.0/16; the pod network, the
// node and the ClusterIP are the seed's too. They exist only inside the test's namespaces.
const (
	lbIPv4      = "172.18.0.18"
	lbIPv6      = "fd18::18"
	subnetV4    = "172.18.0.0/16"
	subnetV6    = "fd18::/64"
	gatewayV4   = "172.18.0.1"
	gatewayV6   = "fd18::1"
	clientV4    = "172.18.0.100"
	clientV6    = "fd18::100"
	outsiderV4  = "172.18.0.200"
	outsiderV6  = "fd18::200"
	podV4       = "10.16.0.2"
	podV6       = "fd16::2"
	nodeV4      = "10.16.0.1"
	nodeV6      = "fd16::1"
	clusterIPv4 = "10.109.201.193"
	clusterIPv6 = "fd96::c1"
)

// topology is one test's set of namespaces:
//
//	client ──┐                                    ┌── lb: net1 (macvlan on node's up0) ── eth0 ──┐
//	outsider ┴── underlay: br0 ── lport ═ up0 (node)                                            node: lo has the ClusterIP
//
// The bridge holds the subnet gateway address, so the lb pod's default route in table 100 has
// somewhere to point.
type topology struct {
	t                                    testing.TB
	suffix                               string
	underlay, client, outsider, lb, node string
	// lbpod is the last process startCommand started.
	lbpod *lbpodProcess
}

// ownersDir records, per namespace suffix, the test process that made those namespaces: t.Cleanup
// removes them, but not when the process is killed (a timeout, a CI machine stopped), and
// sweepOrphans removes those at the next run.
const ownersDir = "/run/lbsvc-dataplane-tests"

// randomSuffix is the suffix of one test's namespace names (every name ends with "-" and it, or
// carries it), recorded as this process's in ownersDir until the test ends.
func randomSuffix(t testing.TB) string {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	s := hex.EncodeToString(b)
	owner := filepath.Join(ownersDir, s)
	if err := os.MkdirAll(ownersDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(owner, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs last: after the namespaces' own cleanups.
	t.Cleanup(func() { os.Remove(owner) })
	return s
}

// sweepOrphans deletes the namespaces of test processes that no longer run (killed before their
// cleanups), and their records. Namespaces of a run still going (another test binary) stay.
func sweepOrphans() {
	owners, err := os.ReadDir(ownersDir)
	if err != nil {
		return // none recorded yet
	}
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, o := range owners {
		pid, err := os.ReadFile(filepath.Join(ownersDir, o.Name()))
		if err == nil {
			if _, err := os.Stat("/proc/" + strings.TrimSpace(string(pid))); err == nil {
				continue // its process still runs
			}
		}
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 0 && strings.Contains(f[0], "-"+o.Name()) {
				if msg, err := exec.Command("ip", "netns", "del", f[0]).CombinedOutput(); err != nil {
					fmt.Fprintf(os.Stderr, "sweep: ip netns del %s: %v %s\n", f[0], err, msg)
				} else {
					fmt.Fprintf(os.Stderr, "sweep: removed %s, left by test process %s\n", f[0], strings.TrimSpace(string(pid)))
				}
			}
		}
		os.Remove(filepath.Join(ownersDir, o.Name()))
	}
}

// newTopology builds the namespaces and links; t.Cleanup removes them (deleting a namespace
// deletes every link in it, and no link is ever created in the test's own namespace).
func newTopology(t testing.TB) *topology {
	t.Helper()
	s := randomSuffix(t)
	tp := &topology{t: t, suffix: s,
		underlay: "lbt-u-" + s, client: "lbt-c-" + s, outsider: "lbt-o-" + s, lb: "lbt-l-" + s, node: "lbt-n-" + s}
	for _, ns := range []string{tp.underlay, tp.client, tp.outsider, tp.lb, tp.node} {
		mustRun(t, "ip", "netns", "add", ns)
		t.Cleanup(func() {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("cleanup: ip netns del %s: %v %s", ns, err, out)
			}
		})
		tp.ip(ns, "link", "set", "lo", "up")
	}
	u := tp.underlay
	tp.ip(u, "link", "add", "br0", "type", "bridge")
	tp.ip(u, "link", "set", "br0", "up")
	for _, port := range []struct{ name, peer, ns string }{
		{"cport", "c0", tp.client}, {"oport", "c0", tp.outsider}, {"lport", "up0", tp.node},
	} {
		tp.ip(u, "link", "add", port.name, "type", "veth", "peer", "name", port.peer, "netns", port.ns)
		tp.ip(u, "link", "set", port.name, "master", "br0", "up")
		tp.ip(port.ns, "link", "set", port.peer, "up")
	}
	// The subnet gateway lives on the bridge (the underlay's router), not on a client: a client
	// holding it would pick it as the source address towards the LB (IPv6 prefers the longest
	// common prefix), which would blur the source-range tests.
	tp.ip(u, "addr", "add", gatewayV4+"/16", "dev", "br0")
	tp.ip(u, "addr", "add", gatewayV6+"/64", "dev", "br0", "nodad")
	tp.ip(tp.client, "addr", "add", clientV4+"/16", "dev", "c0")
	tp.ip(tp.client, "addr", "add", clientV6+"/64", "dev", "c0", "nodad")
	tp.ip(tp.outsider, "addr", "add", outsiderV4+"/16", "dev", "c0")
	tp.ip(tp.outsider, "addr", "add", outsiderV6+"/64", "dev", "c0", "nodad")

	// net1: a macvlan in bridge mode on the node's underlay veth, moved into the lb pod.
	tp.ip(tp.node, "link", "add", "link", "up0", "name", "net1", "type", "macvlan", "mode", "bridge")
	tp.ip(tp.node, "link", "set", "net1", "netns", tp.lb)
	// eth0: the pod's cluster network, a veth to the node, default route via the node.
	tp.ip(tp.node, "link", "add", "nodeveth", "type", "veth", "peer", "name", "eth0", "netns", tp.lb)
	tp.ip(tp.node, "link", "set", "nodeveth", "up")
	tp.ip(tp.node, "addr", "add", nodeV4+"/16", "dev", "nodeveth")
	tp.ip(tp.node, "addr", "add", nodeV6+"/64", "dev", "nodeveth", "nodad")
	tp.ip(tp.lb, "link", "set", "eth0", "up")
	tp.ip(tp.lb, "addr", "add", podV4+"/16", "dev", "eth0")
	tp.ip(tp.lb, "addr", "add", podV6+"/64", "dev", "eth0", "nodad")
	tp.ip(tp.lb, "route", "add", "default", "via", nodeV4, "dev", "eth0")
	tp.ip(tp.lb, "-6", "route", "add", "default", "via", nodeV6, "dev", "eth0")
	// The "ClusterIP", as kube-proxy would present it: an address the node answers on.
	tp.ip(tp.node, "addr", "add", clusterIPv4+"/32", "dev", "lo")
	tp.ip(tp.node, "addr", "add", clusterIPv6+"/128", "dev", "lo", "nodad")
	return tp
}

// Addresses of the remote client, on a network of its own behind the Subnet's gateway.
const (
	remoteV4       = "192.168.50.7"
	remoteV6       = "fd50::7"
	remoteRouterV4 = "192.168.50.1"
	remoteRouterV6 = "fd50::1"
)

// addRemote adds a client that is not on the Subnet, as most clients of a Service are: namespace
// lbt-r-<suffix>, whose c0 is a veth to the underlay namespace, which routes between it and br0
// (the Subnet's gateway). Only what the lb pod sends through the gateway reaches it. It returns
// the namespace.
func (tp *topology) addRemote() string {
	tp.t.Helper()
	ns := "lbt-r-" + tp.suffix
	mustRun(tp.t, "ip", "netns", "add", ns)
	tp.t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			tp.t.Errorf("cleanup: ip netns del %s: %v %s", ns, err, out)
		}
	})
	tp.ip(ns, "link", "set", "lo", "up")
	tp.exec(tp.underlay, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	tp.ip(tp.underlay, "link", "add", "rport", "type", "veth", "peer", "name", "c0", "netns", ns)
	tp.ip(tp.underlay, "link", "set", "rport", "up")
	tp.ip(tp.underlay, "addr", "add", remoteRouterV4+"/24", "dev", "rport")
	tp.ip(tp.underlay, "addr", "add", remoteRouterV6+"/64", "dev", "rport", "nodad")
	tp.ip(ns, "link", "set", "c0", "up")
	tp.ip(ns, "addr", "add", remoteV4+"/24", "dev", "c0")
	tp.ip(ns, "addr", "add", remoteV6+"/64", "dev", "c0", "nodad")
	tp.ip(ns, "route", "add", "default", "via", remoteRouterV4)
	tp.ip(ns, "-6", "route", "add", "default", "via", remoteRouterV6)
	return ns
}

// ip runs `ip -n <ns> args...`, failing the test on error.
func (tp *topology) ip(ns string, args ...string) string {
	tp.t.Helper()
	return mustRun(tp.t, "ip", append([]string{"-n", ns}, args...)...)
}

// exec runs a command inside a namespace, failing the test on error.
func (tp *topology) exec(ns string, args ...string) string {
	tp.t.Helper()
	return mustRun(tp.t, "ip", append([]string{"netns", "exec", ns}, args...)...)
}

func mustRun(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// inNS runs f on an OS thread switched into namespace ns. Sockets created there stay in ns
// after the thread switches back, which is how the backends and clients below live in their
// namespaces while the test drives them from Go.
func inNS(t testing.TB, ns string, f func() error) error {
	t.Helper()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	target, err := netns.GetFromName(ns)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns %s: %w", ns, err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	ferr := f()
	if err := netns.Set(orig); err != nil {
		// Leave the thread locked: Go discards it when the goroutine ends.
		return fmt.Errorf("back to the test's namespace: %w", err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// dialIn opens a connection from namespace ns.
func dialIn(t testing.TB, ns, network, addr string, timeout time.Duration) (net.Conn, error) {
	var conn net.Conn
	err := inNS(t, ns, func() error {
		var err error
		conn, err = net.DialTimeout(network, addr, timeout)
		return err
	})
	return conn, err
}

// httpGet fetches http://host:port/ from namespace ns and returns the body.
func httpGet(t testing.TB, ns, hostPort string) (string, error) {
	return httpGetPath(t, ns, hostPort, "/")
}

// httpGetPath fetches http://host:port<path> from namespace ns and returns the body.
func httpGetPath(t testing.TB, ns, hostPort, path string) (string, error) {
	client := &http.Client{
		Timeout: time.Second,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return dialIn(t, ns, network, addr, time.Second)
			},
		},
	}
	resp, err := client.Get("http://" + hostPort + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("status %d", resp.StatusCode)
	}
	return string(body), nil
}

// udpExchange sends payload to addr from namespace ns and returns the first reply.
func udpExchange(t testing.TB, ns, addr, payload string) (string, error) {
	conn, err := dialIn(t, ns, "udp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(time.Second)); err != nil {
		return "", err
	}
	if _, err := conn.Write([]byte(payload)); err != nil {
		return "", err
	}
	buf := make([]byte, 1500)
	n, err := conn.Read(buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// udpSession opens one UDP socket from ns to addr (one source port, so one conntrack entry) and
// returns a function that sends a payload and reads the reply within 300 ms; the socket closes
// with the test.
func udpSession(t testing.TB, ns, addr string) func(payload string) (string, error) {
	t.Helper()
	conn, err := dialIn(t, ns, "udp", addr, time.Second)
	if err != nil {
		t.Fatalf("udp socket to %s in %s: %v", addr, ns, err)
	}
	t.Cleanup(func() { conn.Close() })
	return func(payload string) (string, error) {
		if err := conn.SetDeadline(time.Now().Add(300 * time.Millisecond)); err != nil {
			return "", err
		}
		if _, err := conn.Write([]byte(payload)); err != nil {
			return "", err
		}
		buf := make([]byte, 1500)
		n, err := conn.Read(buf)
		return string(buf[:n]), err
	}
}

func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// Backend replies, exact so that a test can tell which server and port answered.
func httpReply(ip string, port int) string { return fmt.Sprintf("backend %s port %d\n", ip, port) }
func udpReply(ip string, port int, payload string) string {
	return fmt.Sprintf("backend %s udp %d: %s", ip, port, payload)
}
func echoReply(port int, line string) string { return fmt.Sprintf("echo %d: %s\n", port, line) }

// Ports the node's backends answer on: the Service's `port`s (never the targetPorts).
const (
	httpPort      = 80   // HTTP
	echoPort      = 81   // a line echo, for connections held open across changes
	extraHTTPPort = 8443 // HTTP, added and removed while lbpod runs
	udpPort       = 53
	targetPort    = 8080 // in the Service only: nothing listens on it
)

// listenIn opens a TCP listener in namespace ns.
func listenIn(t testing.TB, ns, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := inNS(t, ns, func() (err error) { ln, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, ns, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// startBackends serves the ClusterIPs in the node namespace: HTTP on httpPort and
// extraHTTPPort, a line echo on echoPort, UDP on udpPort.
func (tp *topology) startBackends() {
	t := tp.t
	t.Helper()
	for _, ip := range []string{clusterIPv4, clusterIPv6} {
		for _, port := range []int{httpPort, extraHTTPPort} {
			body := httpReply(ip, port)
			ln := listenIn(t, tp.node, net.JoinHostPort(ip, fmt.Sprint(port)))
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, body) }), ReadHeaderTimeout: time.Second}
			go srv.Serve(ln)
			t.Cleanup(func() { srv.Close() })
		}
		echo := listenIn(t, tp.node, net.JoinHostPort(ip, fmt.Sprint(echoPort)))
		go func() {
			for {
				c, err := echo.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					sc := bufio.NewScanner(c)
					for sc.Scan() {
						if _, err := io.WriteString(c, echoReply(echoPort, sc.Text())); err != nil {
							return
						}
					}
				}()
			}
		}()
		serveUDP(t, tp.node, net.JoinHostPort(ip, fmt.Sprint(udpPort)), func(payload string) string { return udpReply(ip, udpPort, payload) })
	}
}

// serveUDP answers every datagram to addr in namespace ns with reply(payload) until the test ends.
func serveUDP(t testing.TB, ns, addr string, reply func(payload string) string) {
	t.Helper()
	var pc net.PacketConn
	if err := inNS(t, ns, func() (err error) { pc, err = net.ListenPacket("udp", addr); return err }); err != nil {
		t.Fatalf("udp listen on %s in %s: %v", addr, ns, err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(reply(string(buf[:n]))), from)
		}
	}()
}

// lockedBuffer collects a process's output safely while it runs.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// lbpodProcess is a running `lbpod` main container.
type lbpodProcess struct {
	cmd  *exec.Cmd
	logs *lockedBuffer
	done chan error
}

// stackArgs returns the network flags for a stack: "v4", "v6" or "dual".
func stackArgs(stack string) []string {
	switch stack {
	case "v6":
		return []string{"--addresses", lbIPv6 + "/64", "--gateways", gatewayV6, "--subnets", subnetV6}
	case "dual":
		return []string{"--addresses", lbIPv4 + "/16," + lbIPv6 + "/64", "--gateways", gatewayV4 + "," + gatewayV6, "--subnets", subnetV4 + "," + subnetV6}
	default:
		return []string{"--addresses", lbIPv4 + "/16", "--gateways", gatewayV4, "--subnets", subnetV4}
	}
}

// startLBPod runs `lbpod` in the lb namespace with the Service read from serviceFile.
func (tp *topology) startLBPod(serviceFile string, stack string, extra ...string) *lbpodProcess {
	tp.t.Helper()
	args := append([]string{lbpodBin, "--service-file", serviceFile, "--health-addr", "127.0.0.1:8081"}, stackArgs(stack)...)
	return tp.startCommand(append(args, extra...)...)
}

// startCommand runs a command (lbpod, or a shell that execs it) in the lb namespace; t.Cleanup
// stops it and, when the test failed, logs its output.
func (tp *topology) startCommand(args ...string) *lbpodProcess {
	t := tp.t
	t.Helper()
	p := &lbpodProcess{cmd: exec.Command("ip", append([]string{"netns", "exec", tp.lb}, args...)...), logs: &lockedBuffer{}, done: make(chan error, 1)}
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", strings.Join(args, " "), err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	tp.lbpod = p
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("lbpod log:\n%s", p.logs.String())
		}
	})
	return p
}

// stop sends SIGTERM and waits; it returns how long the exit took.
func (p *lbpodProcess) stop(t testing.TB) time.Duration {
	start := time.Now()
	if p.cmd.ProcessState != nil {
		return 0
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		t.Errorf("lbpod did not exit 5 s after SIGTERM")
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	return time.Since(start)
}

// readyz returns the status code of lbpod's /readyz and its body.
func (tp *topology) readyz() (int, string) { return tp.healthGet("/readyz") }

// healthGet fetches a path from lbpod's health server in the lb namespace.
func (tp *topology) healthGet(path string) (int, string) {
	conn, err := dialIn(tp.t, tp.lb, "tcp", "127.0.0.1:8081", time.Second)
	if err != nil {
		return 0, err.Error()
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nHost: lbpod\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// runInit runs `lbpod init` in the lb namespace and returns its combined output.
func (tp *topology) runInit(serviceFile, stack string, extra ...string) (string, error) {
	args := append([]string{"netns", "exec", tp.lb, lbpodBin, "init", "--service-file", serviceFile}, stackArgs(stack)...)
	args = append(args, extra...)
	out, err := exec.Command("ip", args...).CombinedOutput()
	return string(out), err
}

// servicePort is one port of the test Service.
type servicePort struct {
	Protocol   string
	Port       int
	TargetPort int
}

// writeService writes the Service object lbpod reads with --service-file. It writes a new file
// and renames it over the old one so that lbpod never reads half a file.
func writeService(t testing.TB, path string, clusterIPs []string, ports []servicePort, sourceRanges []string) {
	t.Helper()
	writeFile(t, path, serviceYAML("test-svc", clusterIPs, ports, sourceRanges, nil, nil, nil))
}

// serviceYAML is a Service object of namespace default: its ClusterIPs, ports and source ranges,
// and, when given, its labels and the addresses of its status.loadBalancer.ingress.
func serviceYAML(name string, clusterIPs []string, ports []servicePort, sourceRanges []string, labels map[string]string, ingress []string, admitted []servicePort) string {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: Service\nmetadata:\n  name: " + name + "\n  namespace: default\n")
	if len(labels) > 0 {
		b.WriteString("  labels:\n")
		for k, v := range labels {
			fmt.Fprintf(&b, "    %s: %q\n", k, v)
		}
	}
	b.WriteString("spec:\n  type: LoadBalancer\n")
	b.WriteString("  clusterIPs: [" + strings.Join(clusterIPs, ", ") + "]\n  ports:\n")
	for _, p := range ports {
		tp := p.TargetPort
		if tp == 0 {
			tp = targetPort
		}
		fmt.Fprintf(&b, "  - name: %s-%d\n    protocol: %s\n    port: %d\n    targetPort: %d\n", strings.ToLower(p.Protocol), p.Port, p.Protocol, p.Port, tp)
	}
	if len(sourceRanges) > 0 {
		// Quoted: a bare "::/0" is not a YAML scalar.
		b.WriteString("  loadBalancerSourceRanges: [\"" + strings.Join(sourceRanges, "\", \"") + "\"]\n")
	}
	if len(ingress) > 0 {
		// What the operator writes for a member of a shared address: the ingress entries and our
		// AddressAllocated condition.
		b.WriteString("status:\n  loadBalancer:\n    ingress:\n")
		for _, ip := range ingress {
			fmt.Fprintf(&b, "    - ip: %q\n", ip)
			if len(admitted) > 0 {
				b.WriteString("      ports:\n")
				for _, p := range admitted {
					fmt.Fprintf(&b, "      - port: %d\n        protocol: %s\n", p.Port, p.Protocol)
				}
			}
		}
		fmt.Fprintf(&b, "  conditions:\n  - type: %s\n    status: \"True\"\n    reason: Allocated\n    message: \"\"\n    lastTransitionTime: \"2026-01-01T00:00:00Z\"\n",
			v1alpha1.ConditionAddressAllocated)
	}
	return b.String()
}

// writeFile writes a new file and renames it over path, so that lbpod never reads half a file.
func writeFile(t testing.TB, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// saveWithoutComments returns iptables-save output without its timestamped comment lines.
func saveWithoutComments(out string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, "#") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
