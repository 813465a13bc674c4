//go:build e2e

package e2e

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"
)

// udpFromClient sends one datagram to addr:port from the client namespace and returns the first
// line of the answer (the backend echoes each datagram after its pod name).
func udpFromClient(addr string, port int) (string, error) {
	script := `exec 3<>/dev/udp/` + addr + `/` + strconv.Itoa(port) + ` && printf e2e-ping >&3 && timeout 1 head -n 1 <&3`
	out, err := run("nsenter", "--net=/run/netns/"+clientNetns, "bash", "-c", script)
	return strings.TrimSpace(out), err
}

// TestSharedAddressDNS: a DNS-style pair on one address from the client: TCP 53 of one Service
// and UDP 53 of another, both with lbsvc.io/allow-shared-ip, served by one lb Deployment of the
// address (none of either Service); the second joins without a new address; the UDP member
// leaving under TCP traffic costs the TCP member no request, and its port stops answering.
func TestSharedAddressDNS(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	key := "dns-" + suffix()
	shared := func(name string, proto corev1.Protocol) *corev1.Service {
		s := newLBService(name, "")
		s.Annotations[lbv1.AllowSharedIPAnnotation] = key
		s.Spec.Ports = []corev1.ServicePort{{Name: "dns", Protocol: proto, Port: 53, TargetPort: intstr.FromInt32(80)}}
		return s
	}
	tcp := shared("e2e-share-tcp-"+suffix(), corev1.ProtocolTCP)
	created := time.Now()
	g.Expect(k8s.Create(ctx, tcp)).To(Succeed())
	deleteServiceOnCleanup(t, tcp)
	ip := waitIngress(t, tcp.Namespace, tcp.Name)
	first := timeUntilCurl(t, "http://"+ip+":53/", created, 2*time.Minute)
	t.Logf("figure: shared address, first member created -> first TCP answer: %v", first.Round(10*time.Millisecond))

	udp := shared("e2e-share-udp-"+suffix(), corev1.ProtocolUDP)
	joined := time.Now()
	g.Expect(k8s.Create(ctx, udp)).To(Succeed())
	deleteServiceOnCleanup(t, udp)
	g.Expect(waitIngress(t, udp.Namespace, udp.Name)).To(Equal(ip), "the second member shares the address")
	g.Eventually(udpFromClient).WithArguments(ip, 53).WithTimeout(time.Minute).WithPolling(50 * time.Millisecond).
		Should(BeElementOf(backendNames(t)))
	t.Logf("figure: shared address, joining member created -> first UDP answer: %v", time.Since(joined).Round(10*time.Millisecond))

	// One lb Deployment, the address's; none of either member.
	var deps appsv1.DeploymentList
	g.Expect(k8s.List(ctx, &deps, client.InNamespace(seedNamespace), client.MatchingLabels{lbv1.SharedIPLabel: ip})).To(Succeed())
	g.Expect(deps.Items).To(HaveLen(1))
	g.Expect(deps.Items[0].Name).To(Equal(lbobjects.SharedObjectName(ip)))
	for _, s := range []*corev1.Service{tcp, udp} {
		err := k8s.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: lbobjects.ObjectName(s.Name)}, &appsv1.Deployment{})
		g.Expect(client.IgnoreNotFound(err)).To(Succeed())
		g.Expect(err).To(HaveOccurred(), "member %s has a Deployment of its own", s.Name)
	}
	ipObj := &lbv1.IP{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Name: ip}, ipObj)).To(Succeed())
	var names []string
	for _, m := range ipObj.Spec.Members {
		names = append(names, m.Name+" "+strings.Join(m.Ports, ","))
	}
	g.Expect(names).To(ConsistOf(tcp.Name+" TCP/53", udp.Name+" UDP/53"))

	// The UDP member leaves while a client loop asks the TCP member.
	var sent, failed atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			sent.Add(1)
			if _, err := curlFromClient("http://" + ip + ":53/"); err != nil {
				failed.Add(1)
				t.Logf("TCP 53 while the UDP member leaves: %v", err)
			}
		}
	}()
	g.Expect(k8s.Delete(ctx, udp)).To(Succeed())
	g.Eventually(func() error { _, err := udpFromClient(ip, 53); return err }).WithTimeout(time.Minute).WithPolling(200*time.Millisecond).
		Should(HaveOccurred(), "UDP 53 still answers after its Service left")
	// A little traffic after the rules changed, then the count.
	after := sent.Load()
	g.Eventually(sent.Load).WithTimeout(30 * time.Second).WithPolling(50 * time.Millisecond).Should(BeNumerically(">=", after+20))
	close(stop)
	<-done
	t.Logf("figure: shared address, a member leaving under traffic to another: %d of %d TCP requests failed", failed.Load(), sent.Load())
	g.Expect(failed.Load()).To(BeZero())
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.Get(ctx, client.ObjectKey{Name: ip}, ipObj)).To(Succeed())
		g.Expect(ipObj.Spec.Members).To(HaveLen(1))
		g.Expect(ipObj.Spec.Members[0].Name).To(Equal(tcp.Name))
	}).WithTimeout(time.Minute).Should(Succeed())
}
