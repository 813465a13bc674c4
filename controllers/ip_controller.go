package controllers

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/lbsvc/lbsvc-operator/controllers/decide"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// +kubebuilder:rbac:groups=lbsvc.io,resources=ips/status,verbs=patch
// +kubebuilder:rbac:groups=lbsvc.io,resources=ips/finalizers,verbs=update
// +kubebuilder:rbac:groups=lbsvc.io,resources=ips,verbs=patch;update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=replicasets,verbs=list
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=delete
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get

// indexPodAddress indexes lb pods by the IP object names in their address labels.
const indexPodAddress = "lbsvc.io/address"

// indexIPOwner indexes IP objects by their owner Service's UID.
const indexIPOwner = "lbsvc.io/owner-uid"

// indexIPConflict indexes IP objects in phase Conflict by "<owner namespace>/<family>".
const indexIPConflict = "lbsvc.io/conflict-namespace"

// drainRecheck is how often a draining address whose holders are not pods (a ReplicaSet that
// has not scaled down yet) is looked at again: nothing else would wake it.
const drainRecheck = 2 * time.Second

// IPReconciler keeps each IP object's status (phase, holders) and lets a draining address go
// once no lb pod that could hold it exists. It also drains an address whose owner Service is
// gone (a claim made just before the operator stopped). Only objects provably ours count as
// holders (see drainproof.go); others that carry the address label are ignored and named once
// in a ForeignHolderIgnored Warning Event.
type IPReconciler struct {
	Client client.Client
	// Reader reads from the API server directly: a release is decided on the server's word.
	Reader   client.Reader
	Recorder events.EventRecorder
	// LBPodNamespace is --lb-pod-namespace (empty: lb pods run beside their Service): lb pods
	// there may hold an address.
	LBPodNamespace string
	// LBReplicas is --lb-replicas: with one lb pod per Service the Lease is not read (roles).
	LBReplicas int32
	// SkipNameValidation lets tests run several managers in one process.
	SkipNameValidation bool

	// reported is, per IP object name, the last ForeignHolderIgnored note sent.
	reportedMu sync.Mutex
	reported   map[string]string
	// conflicts serializes the decisions that may put an IP object in phase Conflict.
	conflicts conflictWrites
}

// conflictWrites serializes, per namespace and family (conflictNamespaceKey), the decisions that
// may put an IP object in phase Conflict, and remembers the ones this operator wrote: the bound
// decide.MaxConflictsPerNamespace is checked against the cache, which two workers deciding at
// once, or one deciding right after such a write, would read below the bound (20 concurrent
// reports left 4 or 5 addresses of a namespace in Conflict).
type conflictWrites struct {
	locks keyedLocks
	mu    sync.Mutex
	// written are, per key, the IP objects (name → UID) put in phase Conflict that the cache did
	// not show so yet when last looked at.
	written map[string]map[string]types.UID
}

// note records that ip was put in phase Conflict (with its key locked).
func (c *conflictWrites) note(ip *lbv1.IP) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := conflictNamespaceKey(ip)
	if c.written == nil {
		c.written = map[string]map[string]types.UID{}
	}
	if c.written[key] == nil {
		c.written[key] = map[string]types.UID{}
	}
	c.written[key][ip.Name] = ip.UID
}

// noted says whether ip was put in phase Conflict by this operator and the cache did not show
// it so yet: a pass that reads the older copy decides the same transition again, which must not
// be counted or announced twice.
func (c *conflictWrites) noted(ip *lbv1.IP) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	uid, ok := c.written[conflictNamespaceKey(ip)][ip.Name]
	return ok && uid == ip.UID
}

// unseen are the IP objects of key put in phase Conflict by this operator, as noted.
func (c *conflictWrites) unseen(key string) map[string]types.UID {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.written[key])
}

// seen forgets name of key: the cache shows it in phase Conflict, or no longer shows the object
// written (deleted).
func (c *conflictWrites) seen(key, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.written[key], name)
	if len(c.written[key]) == 0 {
		delete(c.written, key)
	}
}

// SetupWithManager registers the pod index and the controller.
func (r *IPReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Pod{}, indexPodAddress, func(o client.Object) []string {
		return addressLabelValues(o.GetLabels())
	}); err != nil {
		return fmt.Errorf("index pods by address: %w", err)
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &lbv1.IP{}, indexIPOwner, func(o client.Object) []string {
		ip := o.(*lbv1.IP)
		uids := []string{ip.Spec.Service.UID}
		for _, m := range ip.Spec.Members {
			uids = append(uids, m.UID)
		}
		return uids
	}); err != nil {
		return fmt.Errorf("index IP objects by owner: %w", err)
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &lbv1.IP{}, indexIPConflict, func(o client.Object) []string {
		if ip := o.(*lbv1.IP); ip.Status.Phase == lbv1.IPConflict {
			return []string{conflictNamespaceKey(ip)}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index IP objects in conflict: %w", err)
	}
	// A Service that goes may leave a claim it never recorded (it was deleted while the claim
	// was in flight): look at the IP objects it owned.
	ipsOwnedBy := func(ctx context.Context, uid string) []reconcile.Request {
		var list lbv1.IPList
		if uid == "" || mgr.GetCache().List(ctx, &list, client.MatchingFields{indexIPOwner: uid}) != nil {
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(list.Items))
		for i := range list.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: list.Items[i].Name}})
		}
		return reqs
	}
	ownedIPs := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		return ipsOwnedBy(ctx, string(o.GetUID()))
	})
	podAddresses := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		var reqs []reconcile.Request
		for _, n := range addressLabelValues(o.GetLabels()) {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: n}})
		}
		return reqs
	})
	// A Service's Lease names its active lb pod: the holders' roles follow it.
	leaseIPs := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		return ipsOwnedBy(ctx, o.GetLabels()[lbv1.ServiceUIDLabel])
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("ip").
		For(&lbv1.IP{}).
		Watches(&corev1.Pod{}, podAddresses).
		Watches(&coordinationv1.Lease{}, leaseIPs).
		Watches(&appsv1.Deployment{}, podAddresses).
		Watches(&corev1.Service{}, ownedIPs, builder.WithPredicates(predicate.Funcs{
			CreateFunc: func(event.CreateEvent) bool { return false },
			UpdateFunc: func(event.UpdateEvent) bool { return false },
		})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 2, SkipNameValidation: &r.SkipNameValidation}).
		Complete(r)
}

func addressLabelValues(l map[string]string) []string {
	var out []string
	for _, k := range []string{lbv1.IPv4Label, lbv1.IPv6Label} {
		if v := l[k]; v != "" {
			out = append(out, v)
		}
	}
	return out
}

// Reconcile implements reconcile.Reconciler.
func (r *IPReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ip := &lbv1.IP{}
	if err := r.Client.Get(ctx, req.NamespacedName, ip); err != nil {
		if apierrors.IsNotFound(err) {
			r.forgetForeign(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if ip.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.reconcileBound(ctx, ip)
	}
	return r.reconcileDraining(ctx, ip)
}

// holders lists the lb pods (from the cache) of ours that carry the address in their labels
// and may hold it, and names the pods carrying it that are not ours.
func (r *IPReconciler) holders(ctx context.Context, ip *lbv1.IP) ([]corev1.Pod, []string, error) {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.MatchingFields{indexPodAddress: ip.Name}); err != nil {
		return nil, nil, fmt.Errorf("list pods of %s: %w", ip.Name, err)
	}
	sort.Slice(pods.Items, func(i, j int) bool { return decide.PodKey(&pods.Items[i]) < decide.PodKey(&pods.Items[j]) })
	holding, foreign := decide.HoldingPods(pods.Items, ip, r.LBPodNamespace)
	return holding, foreign, nil
}

// reportForeign sends one ForeignHolderIgnored Warning Event on ip when the objects ignored for
// it are not the ones last reported (remembered in memory: after a restart they are reported
// once more).
func (r *IPReconciler) reportForeign(ip *lbv1.IP, foreign []string) {
	msg := decide.ForeignMessage(ip, foreign)
	r.reportedMu.Lock()
	last := r.reported[ip.Name]
	switch {
	case msg == "":
		delete(r.reported, ip.Name)
	case msg != last:
		if r.reported == nil {
			r.reported = map[string]string{}
		}
		r.reported[ip.Name] = msg
	}
	r.reportedMu.Unlock()
	if msg != "" && msg != last {
		r.Recorder.Eventf(ip, nil, corev1.EventTypeWarning, decide.ReasonForeignHolderIgnored, actionRelease, "%s", msg)
	}
}

// forgetForeign drops what was reported about an IP object that is gone.
func (r *IPReconciler) forgetForeign(name string) {
	r.reportedMu.Lock()
	delete(r.reported, name)
	r.reportedMu.Unlock()
}

// activePod is the key ("<namespace>/<name>") of the lb pod among pods that holds the address of
// the owner Service svc, as its Lease records it (decide.ActiveHolder), or "" when none is known.
// Only a Lease with the Service's UID label counts (the operator's cache holds only Leases with our
// component label, which the lb pods' admission policy requires).
func (r *IPReconciler) activePod(ip *lbv1.IP, lease *coordinationv1.Lease, svc *corev1.Service, pods []corev1.Pod) string {
	replicas := decide.ServiceReplicas(svc, r.LBReplicas)
	if ip.Spec.SharingKey != "" {
		replicas = max(r.LBReplicas, 1) // a shared address's lb pods: the default, not a member's
	}
	if p := decide.ActiveHolder(lease, pods, replicas); p != nil {
		return decide.PodKey(p)
	}
	return ""
}

// addressLease is the Lease of the lb pods that hold ip's address from the cache: the Service's
// (svc), or the shared address's; nil when absent or not theirs (its UID label differs, or a
// shared address's Lease does not name it).
func (r *IPReconciler) addressLease(ctx context.Context, ip *lbv1.IP, svc *corev1.Service) (*coordinationv1.Lease, error) {
	l := &coordinationv1.Lease{}
	key := types.NamespacedName{Namespace: svc.Namespace, Name: lbobjects.LeaseName(r.LBPodNamespace, svc.Namespace, svc.Name)}
	uid := string(svc.UID)
	if ip.Spec.SharingKey != "" {
		key = types.NamespacedName{Namespace: lbobjects.SharedLeaseNamespace(r.LBPodNamespace, ip.Spec.Service.Namespace), Name: lbobjects.SharedObjectName(ip.Name)}
		uid = ip.Spec.Service.UID
	}
	switch err := r.Client.Get(ctx, key, l); {
	case err == nil:
		if l.Labels[lbv1.ServiceUIDLabel] == uid && (ip.Spec.SharingKey == "" || l.Labels[lbv1.SharedIPLabel] == ip.Name) {
			return l, nil
		}
		return nil, nil
	case apierrors.IsNotFound(err):
		return nil, nil
	default:
		return nil, fmt.Errorf("get lease %s: %w", key, err)
	}
}

// holderList is status.holders: the pods, then the kept entries (see KeptHolders), at most 16.
// Roles are shown only while a holder is known (active names it, "" for none): the pod that holds
// the address is active, the others standbys. Without one (no Lease yet, a holder that is not one
// of the pods, a drain after the Service went) no pod is called a standby of nobody.
func holderList(pods []corev1.Pod, active string, kept []lbv1.IPHolder) []lbv1.IPHolder {
	var out []lbv1.IPHolder
	for i := range pods {
		h := lbv1.IPHolder{Pod: decide.PodKey(&pods[i]), Node: pods[i].Spec.NodeName}
		switch {
		case active == "":
		case h.Pod == active:
			h.Role = lbv1.RoleActive
		default:
			h.Role = lbv1.RoleStandby
		}
		out = append(out, h)
	}
	out = append(out, kept...)
	// The active holder first: it is the one `kubectl get ips` shows. Sorted before the cut, so
	// that the active one is kept however many others there are.
	slices.SortStableFunc(out, func(a, b lbv1.IPHolder) int {
		return boolRank(b.Role == lbv1.RoleActive) - boolRank(a.Role == lbv1.RoleActive)
	})
	if len(out) > 16 {
		out = out[:16]
	}
	return out
}

// liveService is the Service ns/name of that UID, nil when it is gone. The cache may not have a
// Service created a moment ago: then the API server is asked.
func (r *IPReconciler) liveService(ctx context.Context, ns, name, uid string) (*corev1.Service, error) {
	svc := &corev1.Service{}
	key := types.NamespacedName{Namespace: ns, Name: name}
	err := r.Client.Get(ctx, key, svc)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, err
	}
	if err == nil && string(svc.UID) == uid {
		return svc, nil
	}
	err = r.Reader.Get(ctx, key, svc)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, err
	}
	if err != nil || string(svc.UID) != uid {
		return nil, nil
	}
	return svc, nil
}

// liveOwners are the Services the address is held for that still exist: its owner, or the
// members of a shared address.
func (r *IPReconciler) liveOwners(ctx context.Context, ip *lbv1.IP) ([]*corev1.Service, error) {
	owners := []lbv1.IPMember{{Namespace: ip.Spec.Service.Namespace, Name: ip.Spec.Service.Name, UID: ip.Spec.Service.UID}}
	if ip.Spec.SharingKey != "" {
		owners = ip.Spec.Members
	}
	var out []*corev1.Service
	for _, o := range owners {
		svc, err := r.liveService(ctx, o.Namespace, o.Name, o.UID)
		if err != nil {
			return nil, err
		}
		if svc != nil {
			out = append(out, svc)
		}
	}
	return out, nil
}

// reconcileBound records the holders, and drains the address when its owner Service is gone or
// is another Service now (same name, new UID); of a shared address, when no member is left.
func (r *IPReconciler) reconcileBound(ctx context.Context, ip *lbv1.IP) error {
	svcs, err := r.liveOwners(ctx, ip)
	if err != nil {
		return err
	}
	if len(svcs) == 0 {
		if ip.Status.Phase == lbv1.IPConflict {
			// In use on the underlay: the address stays taken after its Service, until an
			// admin deletes the object.
			pods, _, err := r.holders(ctx, ip)
			if err != nil {
				return err
			}
			return r.patchStatus(ctx, ip, decide.DecideIPConflict(decide.IPConflictInputs{IP: ip}), holderList(pods, "", nil), "")
		}
		// Of the version read: a member that joined a shared address meanwhile keeps it.
		rv := ip.ResourceVersion
		if err := r.Client.Delete(ctx, ip, client.Preconditions{UID: ptrUID(ip.UID), ResourceVersion: &rv}); err != nil &&
			!apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("drain orphaned %s: %w", ip.Name, err)
		}
		return nil
	}
	if ip.Spec.SharingKey != "" && len(svcs) < len(ip.Spec.Members) {
		return r.pruneMembers(ctx, ip, svcs)
	}
	pods, foreign, err := r.holders(ctx, ip)
	if err != nil {
		return err
	}
	var kept []lbv1.IPHolder
	if len(decide.DroppingNamespaces(ip, r.LBPodNamespace, pods)) > 0 {
		// A namespace trusted only through status.holders has no pod of ours any more in the
		// cache: the API server says whether something of ours there holds or may still create
		// one, and its answer is what status.holders records (the cache's pods, listed instead,
		// dropped a pod the cache had not seen yet, and with it the namespace's trust).
		d, err := r.confirmNoHolder(ctx, ip)
		if err != nil {
			return err
		}
		pods, kept, foreign = d.Holding, d.Kept, d.Foreign
	}
	r.reportForeign(ip, foreign)
	svc := svcs[0]
	lease, err := r.addressLease(ctx, ip, svc)
	if err != nil {
		return err
	}
	in := decide.IPConflictInputs{IP: ip, Lease: lease}
	if ip.Status.Phase != lbv1.IPConflict && lease != nil && lease.Annotations[lbv1.AddressConflictAnnotation] != "" {
		// One decision of the namespace and family at a time, until its status write is
		// answered (and noted: the cache may show it later than the next decision reads).
		unlock := r.conflicts.locks.lock(conflictNamespaceKey(ip))
		defer unlock()
		if in.NamespaceConflicts, err = r.namespaceConflicts(ctx, ip); err != nil {
			return err
		}
	}
	cp := decide.DecideIPConflict(in)
	if cp.Ignored != "" && ip.Status.Phase != lbv1.IPConflict {
		logf.FromContext(ctx).Info("conflict report not believed", "ip", ip.Name, "why", cp.Ignored)
	}
	active := ""
	if cp.Phase != lbv1.IPConflict {
		active = r.activePod(ip, lease, svc, pods)
	}
	if err := r.patchStatus(ctx, ip, cp, holderList(pods, active, kept), ""); err != nil {
		return err
	}
	if cp.Event != "" && !r.conflicts.noted(ip) {
		r.conflicts.note(ip)
		// Sent once the status landed: the transition is recorded, a later pass sends nothing
		// (nor one that read the cache before it showed the transition: noted).
		addressConflicts.Inc()
		r.Recorder.Eventf(ip, nil, corev1.EventTypeWarning, decide.ReasonAddressInUse, actionProbe, "%s", cp.Event)
		for _, svc := range svcs {
			if msg := cp.EventFor(ip, svc.Namespace); msg != "" {
				r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, decide.ReasonAddressInUse, actionProbe, "%s", msg)
			}
		}
	}
	return nil
}

// reconcileDraining lets the address go once nothing of ours can hold it: no lb pod of ours
// carries it, no ReplicaSet of ours may still create one, no Deployment of ours still asks for
// it. The last word is the API server's, read past the cache.
func (r *IPReconciler) reconcileDraining(ctx context.Context, ip *lbv1.IP) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(ip, lbv1.DrainFinalizer) {
		return ctrl.Result{}, nil
	}
	if ip.Spec.SharingKey != "" {
		if err := r.deleteSharedObjects(ctx, ip); err != nil {
			return ctrl.Result{}, err
		}
	}
	pods, foreign, err := r.holders(ctx, ip)
	if err != nil {
		return ctrl.Result{}, err
	}
	var kept []lbv1.IPHolder
	var asking []*appsv1.Deployment
	if len(pods) == 0 || len(decide.DroppingNamespaces(ip, r.LBPodNamespace, pods)) > 0 {
		d, err := r.confirmNoHolder(ctx, ip)
		if err != nil {
			return ctrl.Result{}, err
		}
		pods, kept, foreign, asking = d.Holding, d.Kept, d.Foreign, d.Asking
		r.reportForeign(ip, foreign)
		if d.Why == "" && len(pods) == 0 {
			before := ip.DeepCopy()
			controllerutil.RemoveFinalizer(ip, lbv1.DrainFinalizer)
			if err := r.Client.Patch(ctx, ip, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
				return ctrl.Result{}, client.IgnoreNotFound(err)
			}
			drains.Observe(time.Since(ip.DeletionTimestamp.Time).Seconds())
			r.forgetForeign(ip.Name)
			r.Recorder.Eventf(ip, nil, corev1.EventTypeNormal, decide.ReasonDrained, actionRelease,
				"%s is free: no lb pod can hold it any more", ip.Spec.Address)
			return ctrl.Result{}, nil
		}
		if d.Why != "" {
			if err := r.deleteOrphaned(ctx, ip, asking); err != nil {
				return ctrl.Result{}, err
			}
			return ctrl.Result{RequeueAfter: drainRecheck}, r.patchStatus(ctx, ip, draining(ip), holderList(nil, "", kept), d.Why)
		}
	} else {
		r.reportForeign(ip, foreign)
		if asking, err = r.cachedAsking(ctx, ip); err != nil {
			return ctrl.Result{}, err
		}
	}
	// Pods of ours hold the address. A Deployment of ours that still asks for it although its
	// Service is gone would replace them for ever where no garbage collector follows it to the
	// Service (the lb pod namespace layout): delete it, and wait for its pods as for any holder.
	if err := r.deleteOrphaned(ctx, ip, asking); err != nil {
		return ctrl.Result{}, err
	}
	msg := fmt.Sprintf("waiting for %s to be gone", podNames(pods))
	for i := range pods {
		node := pods[i].Spec.NodeName
		if node == "" {
			continue
		}
		ready, err := r.nodeReady(ctx, node)
		if err != nil {
			return ctrl.Result{}, err
		}
		if !ready {
			msg = fmt.Sprintf("pod %s on node %s, which is not Ready, may still hold %s; it is handed out again only once that pod is gone. "+
				"If the node is down for good, delete the pod (kubectl delete pod -n %s %s --force --grace-period=0) or the Node; else recover the node",
				decide.PodKey(&pods[i]), node, ip.Spec.Address, pods[i].Namespace, pods[i].Name)
			if ip.Status.Message != msg {
				r.Recorder.Eventf(ip, nil, corev1.EventTypeWarning, decide.ReasonDrainBlocked, actionRelease, "%s", decide.BoundedMessage(msg))
			}
			break
		}
	}
	active, err := r.drainingActive(ctx, ip, pods)
	if err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, r.patchStatus(ctx, ip, draining(ip), holderList(pods, active, kept), msg)
}

// deleteOrphaned deletes the Deployments of ours that still ask for a draining address although
// its owner Service is gone (decide.Orphaned), so that the drain does not wait for a garbage
// collector that may never come. Gone is the API server's word (liveService); each delete is of
// the version read (UID precondition) and is told in a CleanedUp Event on the IP object.
func (r *IPReconciler) deleteOrphaned(ctx context.Context, ip *lbv1.IP, asking []*appsv1.Deployment) error {
	if len(asking) == 0 || ip.Spec.SharingKey != "" {
		return nil
	}
	owner := ip.Spec.Service
	svc, err := r.liveService(ctx, owner.Namespace, owner.Name, owner.UID)
	if err != nil {
		return err
	}
	for _, d := range decide.Orphaned(ip, asking, svc == nil) {
		err := r.Client.Delete(ctx, d, client.PropagationPolicy(metav1.DeletePropagationBackground), client.Preconditions{UID: ptrUID(d.UID)})
		switch {
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
			continue // gone already, or another object now: the next look decides
		case err != nil:
			return fmt.Errorf("delete deployment %s/%s left for %s/%s: %w", d.Namespace, d.Name, owner.Namespace, owner.Name, err)
		}
		logf.FromContext(ctx).Info("deleted an lb Deployment whose Service is gone", "ip", ip.Name, "deployment", d.Namespace+"/"+d.Name)
		r.Recorder.Eventf(ip, nil, corev1.EventTypeNormal, decide.ReasonCleanedUp, actionRelease,
			"deleted deployment %s/%s: it still asked for %s, and its Service %s/%s is gone", d.Namespace, d.Name, ip.Spec.Address, owner.Namespace, owner.Name)
	}
	return nil
}

// drainingActive is activePod while an address drains: known only while its owner Service still
// exists (the address was let go, not the Service).
func (r *IPReconciler) drainingActive(ctx context.Context, ip *lbv1.IP, pods []corev1.Pod) (string, error) {
	owner := ip.Spec.Service
	svc := &corev1.Service{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: owner.Namespace, Name: owner.Name}, svc); err != nil {
		return "", client.IgnoreNotFound(err)
	}
	if string(svc.UID) != owner.UID || ip.Spec.SharingKey != "" {
		return "", nil
	}
	lease, err := r.addressLease(ctx, ip, svc)
	if err != nil {
		return "", err
	}
	return r.activePod(ip, lease, svc, pods), nil
}

// confirmNoHolder asks the API server for the pods, ReplicaSets and Deployments that carry the
// address, and lets DrainVerdict decide. All three lists are read: it runs once the cache shows
// no holder (when the three had to be read anyway), or when a namespace trusted only through
// status.holders would drop out of it (after --lb-pod-namespace changed).
func (r *IPReconciler) confirmNoHolder(ctx context.Context, ip *lbv1.IP) (decide.DrainDecision, error) {
	sel := addressSelector(ip)
	var pods corev1.PodList
	if err := r.Reader.List(ctx, &pods, sel); err != nil {
		return decide.DrainDecision{}, fmt.Errorf("list pods of %s: %w", ip.Name, err)
	}
	var rss appsv1.ReplicaSetList
	if err := r.Reader.List(ctx, &rss, sel); err != nil {
		return decide.DrainDecision{}, fmt.Errorf("list replicasets of %s: %w", ip.Name, err)
	}
	var deps appsv1.DeploymentList
	if err := r.Reader.List(ctx, &deps, sel); err != nil {
		return decide.DrainDecision{}, fmt.Errorf("list deployments of %s: %w", ip.Name, err)
	}
	sort.Slice(pods.Items, func(i, j int) bool { return decide.PodKey(&pods.Items[i]) < decide.PodKey(&pods.Items[j]) })
	return decide.DrainVerdict(ip, r.LBPodNamespace, pods.Items, rss.Items, deps.Items), nil
}

// conflictNamespaceKey is indexIPConflict's key of ip: its owner's namespace and its family (as
// the address label's key).
func conflictNamespaceKey(ip *lbv1.IP) string {
	return ip.Spec.Service.Namespace + "/" + addressLabelKey(ip)
}

// namespaceConflicts is decide.IPConflictInputs.NamespaceConflicts for ip: the IP objects the
// cache shows in phase Conflict, and those this operator put there that the cache does not show
// so yet (with ip's key locked: see conflictWrites).
func (r *IPReconciler) namespaceConflicts(ctx context.Context, ip *lbv1.IP) (int, error) {
	key := conflictNamespaceKey(ip)
	var list lbv1.IPList
	if err := r.Client.List(ctx, &list, client.MatchingFields{indexIPConflict: key}); err != nil {
		return 0, fmt.Errorf("list the IP objects in conflict of namespace %s: %w", ip.Spec.Service.Namespace, err)
	}
	counted := map[string]bool{ip.Name: true}
	for i := range list.Items {
		counted[list.Items[i].Name] = true
	}
	n := len(counted) - 1
	for name, uid := range r.conflicts.unseen(key) {
		if counted[name] {
			if name != ip.Name {
				r.conflicts.seen(key, name)
			}
			continue
		}
		cached := &lbv1.IP{}
		switch err := r.Client.Get(ctx, client.ObjectKey{Name: name}, cached); {
		case apierrors.IsNotFound(err) || err == nil && cached.UID != uid:
			r.conflicts.seen(key, name)
		case err != nil:
			return 0, fmt.Errorf("get IP %s: %w", name, err)
		default:
			n++
		}
	}
	return n, nil
}

// addressLabelKey is the key of ip's address label: an IPv6 address's IP object name has dashes.
func addressLabelKey(ip *lbv1.IP) string {
	if strings.Contains(ip.Name, "-") {
		return lbv1.IPv6Label
	}
	return lbv1.IPv4Label
}

// addressSelector selects the objects that carry ip's address label.
func addressSelector(ip *lbv1.IP) client.MatchingLabels {
	return client.MatchingLabels{addressLabelKey(ip): ip.Name}
}

// cachedAsking are the Deployments of ours that still ask for ip's address, as the cache has them
// (decide.AskingDeployments): read while pods of ours hold the address, when the API server's
// lists are not (confirmNoHolder).
func (r *IPReconciler) cachedAsking(ctx context.Context, ip *lbv1.IP) ([]*appsv1.Deployment, error) {
	var deps appsv1.DeploymentList
	if err := r.Client.List(ctx, &deps, addressSelector(ip)); err != nil {
		return nil, fmt.Errorf("list deployments of %s: %w", ip.Name, err)
	}
	return decide.AskingDeployments(ip, r.LBPodNamespace, deps.Items), nil
}

func podNames(pods []corev1.Pod) string {
	names := make([]string, 0, len(pods))
	for i := range pods {
		if len(names) == 5 {
			names = append(names, fmt.Sprintf("and %d more", len(pods)-5))
			break
		}
		names = append(names, "pod "+decide.PodKey(&pods[i]))
	}
	return strings.Join(names, ", ")
}

func (r *IPReconciler) nodeReady(ctx context.Context, name string) (bool, error) {
	node := &corev1.Node{}
	if err := r.Reader.Get(ctx, types.NamespacedName{Name: name}, node); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("get node %s: %w", name, err)
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue, nil
		}
	}
	return false, nil
}

// draining is the phase of an address being let go; what the probe recorded stays.
func draining(ip *lbv1.IP) decide.IPConflictPlan {
	return decide.IPConflictPlan{Phase: lbv1.IPDraining, Announced: ip.Status.Announced, Conflict: ip.Status.Conflict}
}

// patchStatus writes the phase (with the probe's record) and holders, in one patch when anything
// changed. In phase Conflict the message is the conflict's.
func (r *IPReconciler) patchStatus(ctx context.Context, ip *lbv1.IP, cp decide.IPConflictPlan, holders []lbv1.IPHolder, msg string) error {
	before := ip.DeepCopy()
	ip.Status.Phase = cp.Phase
	ip.Status.Announced = cp.Announced
	ip.Status.Conflict = cp.Conflict
	if cp.Phase == lbv1.IPConflict {
		msg = cp.Message
	}
	ip.Status.Holders = holders
	ip.Status.Node, ip.Status.Active = "", ""
	if len(ip.Status.Holders) > 0 && ip.Status.Holders[0].Role == lbv1.RoleActive {
		ip.Status.Active = ip.Status.Holders[0].Pod
	}
	for _, h := range ip.Status.Holders {
		if h.Node != "" {
			ip.Status.Node = h.Node
			break
		}
	}
	ip.Status.Message = decide.BoundedMessage(msg)
	ip.Status.Members = decide.MemberNames(ip.Spec.Service.Namespace, ip.Spec.Members)
	if equality.Semantic.DeepEqual(before.Status, ip.Status) {
		return nil
	}
	if err := r.Client.Status().Patch(ctx, ip, client.MergeFrom(before)); err != nil {
		return client.IgnoreNotFound(err)
	}
	return nil
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// deleteSharedObjects deletes the lb objects of a shared address that drains: they belong to no
// member, so no Service pass deletes them (the garbage collector would only once the IP object is
// gone, which waits for their pods). Only those provably the address's: at its names, with its
// SharedIPLabel and its owner's UID label.
func (r *IPReconciler) deleteSharedObjects(ctx context.Context, ip *lbv1.IP) error {
	name := lbobjects.SharedObjectName(ip.Name)
	// Wherever they are: in the lb pod namespace, and in one a run with another
	// --lb-pod-namespace left them (whose Deployment would otherwise ask for the address for
	// ever); its RoleBindings beside the owner, in every member namespace and the lb pod
	// namespace.
	var objects []client.Object
	for _, l := range []client.ObjectList{&appsv1.DeploymentList{}, &corev1.ServiceAccountList{}, &policyv1.PodDisruptionBudgetList{}, &rbacv1.RoleBindingList{}} {
		if err := r.Client.List(ctx, l, client.MatchingLabels{lbv1.SharedIPLabel: ip.Name}); err != nil {
			return fmt.Errorf("list the objects of %s: %w", name, err)
		}
		if err := apimeta.EachListItem(l, func(o runtime.Object) error { objects = append(objects, o.(client.Object)); return nil }); err != nil {
			return err
		}
	}
	for _, o := range objects {
		l := o.GetLabels()
		if o.GetName() != name || l[lbv1.SharedIPLabel] != ip.Name || l[lbv1.ServiceUIDLabel] != ip.Spec.Service.UID || !o.GetDeletionTimestamp().IsZero() {
			continue
		}
		if err := r.Client.Delete(ctx, o, client.PropagationPolicy(metav1.DeletePropagationBackground),
			client.Preconditions{UID: ptrUID(o.GetUID())}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete %s %s/%s of drained shared address: %w", lbobjects.KindOf(o), o.GetNamespace(), name, err)
		}
	}
	return nil
}

// pruneMembers takes the members whose Service is gone (live are those that exist) off a shared
// address, at the version read: a Service deleted before its pass recorded it as served (no
// finalizer yet) never leaves by itself, and its ports would stay taken. The update that follows
// brings the next pass.
func (r *IPReconciler) pruneMembers(ctx context.Context, ip *lbv1.IP, live []*corev1.Service) error {
	upd := ip.DeepCopy()
	upd.Spec.Members = slices.DeleteFunc(upd.Spec.Members, func(m lbv1.IPMember) bool {
		return !slices.ContainsFunc(live, func(s *corev1.Service) bool { return string(s.UID) == m.UID })
	})
	if err := r.Client.Update(ctx, upd); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("take the members whose Service is gone off %s: %w", ip.Name, err)
	}
	return nil
}
