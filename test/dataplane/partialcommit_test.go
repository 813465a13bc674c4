//go:build dataplane

package dataplane

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// A sync whose rules went in only in part still forgets the flows the part that went in no
// longer translates: the nat table committed and the filter table of the same iptables-restore
// run refused, or the IPv4 run in and the IPv6 run refused. The applier retries at once from a
// fresh read, which finds the committed nat rules as wanted; before, that retry planned no
// conntrack deletion for them, and a UDP client the narrowed source ranges no longer allow
// kept being DNATed to the ClusterIP on its old entry for as long as it kept sending.
//
// The wrappers refuse the first payload that narrows LBSVC-PREROUTING (a patch deleting a
// range's rule): iptables-restore by committing it with a filter table that cannot go in
// behind it (the real binary's partial commit), ip6tables-restore by refusing it whole.
func TestPartialCommitForgetsFlows(t *testing.T) {
	const narrowing = `case "$payload" in *'-D LBSVC-PREROUTING'*) if [ ! -e "$dir/refused" ]; then touch "$dir/refused"; `
	for _, c := range []struct{ name, wrapped, body string }{
		{"nat in, filter refused", "iptables-restore", narrowing +
			`printf '%s\n*filter\n-A LBSVC-NO-SUCH-CHAIN -j DROP\nCOMMIT\n' "$payload" | "$real" "$@"; exit $?; fi;; esac` + "\n"},
		{"IPv4 in, IPv6 refused", "ip6tables-restore", narrowing +
			`echo 'ip6tables-restore: line 2 failed' >&2; exit 1; fi;; esac` + "\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			tp := newTopology(t)
			tp.startBackends()
			real, err := exec.LookPath(c.wrapped)
			g.Expect(err).NotTo(HaveOccurred())
			dir := t.TempDir()
			wrapper := "#!/bin/sh\ndir=" + dir + "\nreal=" + real + "\npayload=$(cat)\n" + c.body + `printf '%s\n' "$payload" | exec "$real" "$@"` + "\n"
			g.Expect(os.WriteFile(filepath.Join(dir, c.wrapped), []byte(wrapper), 0o755)).To(Succeed())
			svc := filepath.Join(t.TempDir(), "svc.yaml")
			clusterIPs := []string{clusterIPv4, clusterIPv6}
			writeService(t, svc, clusterIPs, basePorts, []string{clientV4 + "/32", outsiderV4 + "/32", clientV6 + "/128", outsiderV6 + "/128"})
			p := tp.startCommand(append([]string{"env", "PATH=" + dir + ":" + os.Getenv("PATH"), lbpodBin, "--service-file", svc, "--health-addr", "127.0.0.1:8081",
				"--iptables", "plain", "--rules", "iptables"}, stackArgs("dual")...)...)
			waitReady(g, tp)
			client, outsider := udpSession(t, tp.client, lbAddr(lbIPv4, udpPort)), udpSession(t, tp.outsider, lbAddr(lbIPv4, udpPort))
			g.Expect(client("a")).To(Equal(udpReply(clusterIPv4, udpPort, "a")))
			g.Expect(outsider("a")).To(Equal(udpReply(clusterIPv4, udpPort, "a")))

			writeService(t, svc, clusterIPs, basePorts, []string{clientV4 + "/32", clientV6 + "/128"})
			g.Eventually(func() error { _, err := outsider("again"); return err }).
				WithTimeout(2 * time.Second).WithPolling(20 * time.Millisecond).Should(Satisfy(isRefused))
			g.Expect(filepath.Join(dir, "refused")).To(BeAnExistingFile(), "the wrapper refused the narrowing once")
			g.Expect(client("b")).To(Equal(udpReply(clusterIPv4, udpPort, "b")))
			g.Eventually(p.logs.String).WithTimeout(time.Second).WithPolling(20 * time.Millisecond).Should(ContainSubstring(
				`msg="deleted stale conntrack entries" family=IPv4 keep="sources 172.18.0.100/32, ports [sctp/3868->10.109.201.193:3868 udp/53->10.109.201.193:53]" entries=1`))
			g.Expect(p.logs.String()).To(ContainSubstring(`msg="a transaction planned from the cached tables was refused; reading them again"`))
			waitReady(g, tp)
		})
	}
}
