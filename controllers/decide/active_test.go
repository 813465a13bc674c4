package decide

import (
	"reflect"
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func lbPod(name, node string, ready bool, role string) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{}},
		Spec: corev1.PodSpec{NodeName: node}}
	if role != "" {
		p.Labels["lbsvc.io/role"] = role
	}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
	return p
}

func holderLease(id string) *coordinationv1.Lease {
	l := &coordinationv1.Lease{}
	if id != "" {
		l.Spec.HolderIdentity = ptr.To(id)
	}
	return l
}

// shown is a Service as the operator left it showing pod on node: the mirror annotations and the
// AddressActive condition (the one DecideActive reads).
func shown(pod, node string) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "s", Annotations: map[string]string{}}}
	if pod != "" {
		s.Annotations["lbsvc.io/active-pod"] = pod
		s.Annotations["lbsvc.io/active-node"] = node
		s.Status.Conditions = []metav1.Condition{{Type: ConditionAddressActive, Status: metav1.ConditionTrue, Reason: ReasonActiveHolder,
			Message: "172.18.0.18 held by pod " + pod + " on node " + nodeOrUnscheduled(node) + "; standby: default/x on node n9"}}
	}
	return s
}

// forged is shown(pod, node) with the mirror annotations then edited by the Service's tenant.
func forged(pod, node, annotatedPod string) *corev1.Service {
	s := shown(pod, node)
	s.Annotations["lbsvc.io/active-pod"] = annotatedPod
	return s
}

func TestDecideActive(t *testing.T) {
	deleting := lbPod("b", "n2", true, "active")
	deleting.DeletionTimestamp = &metav1.Time{}
	for _, tc := range []struct {
		name      string
		in        ActiveInputs
		pod, node string
		status    metav1.ConditionStatus
		message   string
		event     string
	}{{
		name: "first holder of two",
		in: ActiveInputs{Service: shown("", ""), Lease: holderLease("a"), Replicas: 2, Addresses: "172.18.0.18",
			Pods: []corev1.Pod{lbPod("b", "n2", true, ""), lbPod("a", "n1", true, "")}},
		pod: "default/a", node: "n1",
		status:  metav1.ConditionTrue,
		message: "172.18.0.18 held by pod default/a on node n1; standby: default/b on node n2",
		event:   "172.18.0.18 now held by pod default/a on node n1",
	}, {
		name: "moved: the event names both",
		in: ActiveInputs{Service: shown("default/a", "n1"), Lease: holderLease("b"), Replicas: 2, Addresses: "172.18.0.18",
			Pods: []corev1.Pod{lbPod("a", "n1", false, "active"), lbPod("b", "n2", true, "standby")}},
		pod: "default/b", node: "n2",
		status:  metav1.ConditionTrue,
		message: "172.18.0.18 held by pod default/b on node n2; standby: default/a on node n1",
		event:   "172.18.0.18 now held by pod default/b on node n2 (was pod default/a on node n1)",
	}, {
		name: "moved, the mirror edited to the new holder first: the event still names both",
		in: ActiveInputs{Service: forged("default/a", "n1", "default/b"), Lease: holderLease("b"), Replicas: 2, Addresses: "172.18.0.18",
			Pods: []corev1.Pod{lbPod("a", "n1", false, "active"), lbPod("b", "n2", true, "standby")}},
		pod: "default/b", node: "n2",
		status:  metav1.ConditionTrue,
		message: "172.18.0.18 held by pod default/b on node n2; standby: default/a on node n1",
		event:   "172.18.0.18 now held by pod default/b on node n2 (was pod default/a on node n1)",
	}, {
		name: "unchanged, the mirror edited to another pod: no event (the status names the holder)",
		in: ActiveInputs{Service: forged("default/a", "n1", "team-b/evil"), Lease: holderLease("a"), Replicas: 2, Addresses: "172.18.0.18",
			Pods: []corev1.Pod{lbPod("a", "n1", true, "active"), lbPod("b", "n2", true, "standby")}},
		pod: "default/a", node: "n1", status: metav1.ConditionTrue,
		message: "172.18.0.18 held by pod default/a on node n1; standby: default/b on node n2",
	}, {
		name: "unchanged: nothing to write",
		in: ActiveInputs{Service: shown("default/a", "n1"), Lease: holderLease("a"), Replicas: 2, Addresses: "172.18.0.18",
			Pods: []corev1.Pod{lbPod("a", "n1", true, "active"), lbPod("b", "n2", true, "standby")}},
		pod: "default/a", node: "n1", status: metav1.ConditionTrue,
		message: "172.18.0.18 held by pod default/a on node n1; standby: default/b on node n2",
	}, {
		name: "lease names a pod that is not ours: no holder shown",
		in: ActiveInputs{Service: shown("default/a", "n1"), Lease: holderLease("evil"), Replicas: 2, Addresses: "172.18.0.18",
			Pods: []corev1.Pod{lbPod("a", "n1", true, "active")}},
		status:  metav1.ConditionFalse,
		message: "no lb pod has reported holding 172.18.0.18 yet; standby: default/a on node n1",
	}, {
		name: "empty lease, pods not scheduled",
		in: ActiveInputs{Service: shown("", ""), Lease: holderLease(""), Replicas: 2, Addresses: "172.18.0.18,fd00::12",
			Pods: []corev1.Pod{lbPod("a", "", false, "")}},
		status:  metav1.ConditionFalse,
		message: "no lb pod has reported holding 172.18.0.18,fd00::12 yet; standby: default/a on node (unscheduled)",
	}, {
		name: "terminating old active still named: shown until the new one writes",
		in: ActiveInputs{Service: shown("default/b", "n2"), Lease: holderLease("b"), Replicas: 2, Addresses: "172.18.0.18",
			Pods: []corev1.Pod{lbPod("a", "n1", true, "standby"), deleting}},
		pod: "default/b", node: "n2", status: metav1.ConditionTrue,
		message: "172.18.0.18 held by pod default/b on node n2; standby: default/a on node n1",
	}, {
		name: "single lb pod without lease: the ready one",
		in: ActiveInputs{Service: shown("", ""), Addresses: "172.18.0.18",
			Pods: []corev1.Pod{lbPod("a", "n1", true, "")}},
		pod: "default/a", node: "n1",
		status:  metav1.ConditionTrue,
		message: "172.18.0.18 held by pod default/a on node n1; no standby",
		event:   "172.18.0.18 now held by pod default/a on node n1",
	}, {
		name: "lease not written yet, one ready pod: that one",
		in: ActiveInputs{Service: shown("default/a", "n1"), Lease: holderLease(""), Replicas: 2, Addresses: "172.18.0.18",
			Pods: []corev1.Pod{lbPod("a", "n1", true, "active"), lbPod("b", "n2", false, "")}},
		pod: "default/a", node: "n1", status: metav1.ConditionTrue,
		message: "172.18.0.18 held by pod default/a on node n1; standby: default/b on node n2",
	}, {
		name: "one lb pod, a Lease left from standbys naming a gone pod: not read",
		in: ActiveInputs{Service: shown("default/old", "n2"), Lease: holderLease("old"), Replicas: 1, Addresses: "172.18.0.18",
			Pods: []corev1.Pod{lbPod("a", "n1", true, "")}},
		pod: "default/a", node: "n1", status: metav1.ConditionTrue,
		message: "172.18.0.18 held by pod default/a on node n1; no standby",
		event:   "172.18.0.18 now held by pod default/a on node n1 (was pod default/old on node n2)",
	}, {
		name: "single lb pod without lease, not ready: none",
		in: ActiveInputs{Service: shown("", ""), Addresses: "172.18.0.18",
			Pods: []corev1.Pod{lbPod("a", "n1", false, "")}},
		status:  metav1.ConditionFalse,
		message: "no lb pod has reported holding 172.18.0.18 yet; standby: default/a on node n1",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := DecideActive(tc.in)
			if got.ActivePod != tc.pod || got.ActiveNode != tc.node {
				t.Errorf("holder %q %q, want %q %q", got.ActivePod, got.ActiveNode, tc.pod, tc.node)
			}
			wantAnn := map[string]string{"lbsvc.io/active-pod": tc.pod, "lbsvc.io/active-node": tc.node}
			if !reflect.DeepEqual(got.Annotations, wantAnn) {
				t.Errorf("annotations %v, want %v", got.Annotations, wantAnn)
			}
			c := got.Condition
			wantReason := "ActiveHolder"
			if tc.status == metav1.ConditionFalse {
				wantReason = "NoActiveHolder"
			}
			if c.Type != "lbsvc.io/AddressActive" || c.Status != tc.status || c.Reason != wantReason || c.Message != tc.message {
				t.Errorf("condition %+v, want %s %s %q", c, tc.status, wantReason, tc.message)
			}
			gotEvent := ""
			if got.Event != nil {
				gotEvent = got.Event.Message
				if got.Event.Reason != "ActiveHolder" {
					t.Errorf("event reason %q", got.Event.Reason)
				}
			}
			if gotEvent != tc.event {
				t.Errorf("event %q, want %q", gotEvent, tc.event)
			}
		})
	}
}

// FuzzDecideActive: whatever the Lease says and whatever the pods are, the holder shown is one
// of the Service's pods, and with standbys the one the Lease names when it names one.
func FuzzDecideActive(f *testing.F) {
	f.Add("a", "a,b", "n1,n2", uint8(3), "")
	f.Add("", "a", "", uint8(0), "default/a")
	f.Add("x", "a,b,c", "n1,,n3", uint8(5), "default/b")
	f.Fuzz(func(t *testing.T, holder, names, nodes string, ready uint8, was string) {
		var pods []corev1.Pod
		nodeList := splitList(nodes)
		seenName := map[string]bool{}
		for i, n := range splitList(names) {
			if seenName[n] {
				continue // pod names are unique in a namespace
			}
			seenName[n] = true
			node := ""
			if i < len(nodeList) {
				node = nodeList[i]
			}
			pods = append(pods, lbPod(n, node, ready&(1<<(i%8)) != 0, ""))
		}
		in := ActiveInputs{Service: shown(was, "n"), Pods: pods, Addresses: "172.18.0.18", Replicas: 1 + int32(ready%2)}
		if holder != "-" {
			in.Lease = holderLease(holder)
		}
		got := DecideActive(in)
		if got.ActivePod != "" && !seenName[strings.TrimPrefix(got.ActivePod, "default/")] {
			t.Fatalf("shown %q, not one of the pods %v", got.ActivePod, names)
		}
		record := in.Replicas > 1 && leaseHolder(in.Lease) != ""
		if got.ActivePod != "" && record && got.ActivePod != "default/"+holder {
			t.Fatalf("shown %q, lease names %q", got.ActivePod, holder)
		}
		if got.ActivePod != "" && !record {
			// No record: only a Ready pod, and only when it is the one live pod that is Ready.
			ready := 0
			for i := range pods {
				if podReady(&pods[i]) {
					ready++
				}
			}
			if ready != 1 {
				t.Fatalf("shown %q without a record, with %d Ready pods", got.ActivePod, ready)
			}
		}
		if (got.ActivePod == "") != (got.Condition.Status == metav1.ConditionFalse) {
			t.Fatalf("holder %q with condition %+v", got.ActivePod, got.Condition)
		}
		if len(got.Condition.Message) > MaxMessageBytes {
			t.Fatalf("message of %d bytes", len(got.Condition.Message))
		}
	})
}

// splitList splits a comma-separated fuzz input.
func splitList(s string) []string {
	if s == "" {
		return nil
	}
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return out
}

func TestShownHolder(t *testing.T) {
	cond := func(status metav1.ConditionStatus, reason, msg string) *corev1.Service {
		s := &corev1.Service{}
		s.Status.Conditions = []metav1.Condition{{Type: ConditionAddressActive, Status: status, Reason: reason, Message: msg}}
		return s
	}
	for _, tc := range []struct {
		name      string
		svc       *corev1.Service
		pod, node string
	}{
		{"none", nil, "", ""},
		{"no condition", &corev1.Service{}, "", ""},
		{"held", cond("True", ReasonActiveHolder, "172.18.0.18,fd00::12 held by pod default/a on node n1; standby: default/b on node n2"), "default/a", "n1"},
		{"unscheduled node", cond("True", ReasonActiveHolder, "172.18.0.18 held by pod default/a on node (unscheduled); no standby"), "default/a", ""},
		{"no holder", cond("False", ReasonNoActiveHolder, "no lb pod has reported holding 172.18.0.18 yet; standby: default/a on node n1"), "", ""},
		{"not our wording", cond("True", ReasonActiveHolder, "something else"), "", ""},
	} {
		if pod, node := ShownHolder(tc.svc); pod != tc.pod || node != tc.node {
			t.Errorf("%s: ShownHolder = %q %q, want %q %q", tc.name, pod, node, tc.pod, tc.node)
		}
	}
	// The wording ShownHolder parses is DecideActive's own.
	plan := DecideActive(ActiveInputs{Service: &corev1.Service{}, Lease: holderLease("a"), Replicas: 2, Addresses: "172.18.0.18",
		Pods: []corev1.Pod{lbPod("a", "n1", true, ""), lbPod("b", "n2", true, "")}})
	svc := &corev1.Service{}
	svc.Status.Conditions = []metav1.Condition{plan.Condition}
	if pod, node := ShownHolder(svc); pod != "default/a" || node != "n1" {
		t.Errorf("ShownHolder of DecideActive's own condition = %q %q, want default/a n1", pod, node)
	}
}
