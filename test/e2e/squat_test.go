//go:build e2e

package e2e

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/decide"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"
)

// TestSquattersDelayNoClaimant (issue 22, drain squatting) on the real cluster: a tenant of another
// namespace labels a zero-replica Deployment and a running pod with a Service's address, our
// component and managed-by labels, and that Service's UID (the strongest forgery a tenant can
// write). The Service is deleted: its address is released as soon as its own lb pod is gone, the
// next Service asking for that exact address gets it and answers, the squatter pod is never listed
// as a holder of the address, the IP object's Warning Event names the squatters, and they are
// left alone.
func TestSquattersDelayNoClaimant(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	id := suffix()
	const addr = "172.18.0.240"
	first := newLBService("e2e-squat-"+id, addr, 80)
	g.Expect(k8s.Create(ctx, first)).To(Succeed())
	deleteServiceOnCleanup(t, first)
	g.Expect(waitIngress(t, first.Namespace, first.Name)).To(Equal(addr))
	timeUntilCurl(t, "http://"+addr+"/", time.Now(), time.Minute)

	teamB := "e2e-team-b-" + id
	g.Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: teamB}})).To(Succeed())
	t.Cleanup(func() {
		_ = k8s.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: teamB}})
	})
	forged := func(extra map[string]string) map[string]string {
		l := map[string]string{
			lbv1.ComponentLabel: lbv1.ComponentLBPod, lbobjects.ManagedByLabel: lbobjects.ManagedByValue,
			lbv1.ServiceUIDLabel: string(first.UID), lbv1.ServiceLabel: first.Name, lbv1.IPv4Label: addr,
		}
		for k, v := range extra {
			l[k] = v
		}
		return l
	}
	echo := corev1.Container{Name: "echo", Image: "localhost/lbsvc-echo:dev", ImagePullPolicy: corev1.PullIfNotPresent}
	squatDeploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "squat", Namespace: teamB, Labels: forged(nil)},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](0),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"squat": id}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: forged(map[string]string{"squat": id})},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{echo}},
			},
		},
	}
	squatPod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "squat", Namespace: teamB, Labels: forged(nil)},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{echo}},
	}
	g.Expect(k8s.Create(ctx, squatDeploy)).To(Succeed())
	g.Expect(k8s.Create(ctx, squatPod)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(squatPod), squatPod)).To(Succeed())
		g.Expect(podReady(squatPod)).To(BeTrue())
	}).WithTimeout(2*time.Minute).WithPolling(200*time.Millisecond).Should(Succeed(), "the squatter pod runs")

	// From now on, every status of the address's IP objects is sampled: the squatter never shows.
	squatter := teamB + "/squat"
	stop := make(chan struct{})
	listed := make(chan []string, 1)
	go func() {
		var seen []string
		for {
			ip := &lbv1.IP{}
			if err := k8s.Get(context.Background(), client.ObjectKey{Name: addr}, ip); err == nil {
				for _, h := range ip.Status.Holders {
					if h.Pod == squatter {
						seen = append(seen, ip.Name+" "+string(ip.Status.Phase))
					}
				}
				if ip.Status.Active == squatter {
					seen = append(seen, ip.Name+" active")
				}
			}
			select {
			case <-stop:
				listed <- seen
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()

	ip := &lbv1.IP{}
	g.Expect(k8s.Get(ctx, client.ObjectKey{Name: addr}, ip)).To(Succeed())
	victim := ip.UID
	g.Eventually(func() ([]string, error) { return ipEventReasons(ctx, victim) }).WithTimeout(time.Minute).WithPolling(250*time.Millisecond).
		Should(ContainElement(decide.ReasonForeignHolderIgnored), "a Warning Event on IP %s names the squatters", addr)

	deleted := time.Now()
	g.Expect(k8s.Delete(ctx, first)).To(Succeed())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Name: addr}, &lbv1.IP{}))
	}).WithTimeout(2*time.Minute).WithPolling(100*time.Millisecond).Should(BeTrue(), "%s released while team-b's objects carry its label", addr)
	t.Logf("figure: squatted_address_released_ms=%d (Service deleted -> IP object gone; squatters: a zero-replica Deployment and a running pod in %s)",
		time.Since(deleted).Milliseconds(), teamB)

	next := newLBService("e2e-squat-next-"+id, addr, 80)
	g.Expect(k8s.Create(ctx, next)).To(Succeed())
	deleteServiceOnCleanup(t, next)
	g.Expect(waitIngress(t, next.Namespace, next.Name)).To(Equal(addr))
	t.Logf("figure: squatted_address_next_answer_ms=%d (Service deleted -> the next Service with that address answers)",
		timeUntilCurl(t, "http://"+addr+"/", deleted, time.Minute).Milliseconds())
	close(stop)
	g.Expect(<-listed).To(BeEmpty(), "statuses of %s listing the squatter pod", addr)

	// team-b's objects are its own business: untouched.
	for _, o := range []client.Object{squatDeploy, squatPod} {
		cur := o.DeepCopyObject().(client.Object)
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(o), cur)).To(Succeed())
		g.Expect(cur.GetUID()).To(Equal(o.GetUID()))
		g.Expect(cur.GetDeletionTimestamp()).To(BeNil())
	}
}

// ipEventReasons lists the reasons of the Events about the IP object with that UID (IP objects are
// cluster-scoped: their Events are in the default namespace).
func ipEventReasons(ctx context.Context, uid types.UID) ([]string, error) {
	var evs eventsv1.EventList
	if err := k8s.List(ctx, &evs); err != nil {
		return nil, err
	}
	var out []string
	for _, e := range evs.Items {
		if e.Regarding.UID == uid {
			out = append(out, e.Reason)
		}
	}
	return out, nil
}
