package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
	"github.com/lbsvc/lbsvc-operator/controllers/decide"
	"github.com/lbsvc/lbsvc-operator/controllers/lbobjects"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The ensure machinery of the Service pass: the per-Service objects created, compared and server-
// side applied (template replacement for hand additions, the Recreate fix, spec digests for the
// trimmed cache), deleted, and the checks of whose an object is.

// ensureObjects makes the Service's objects what objects says, stage by stage (Set.Stages, each
// stage's objects in parallel), and deletes those the Set leaves out. It returns the Deployment
// as ensured, or the name of an object in the way that is not ours (left untouched). confirmed is
// recordServed's: the pass's own write already showed that the Service lives.
func (r *ServiceReconciler) ensureObjects(ctx context.Context, svc *corev1.Service, objects lbobjects.Set, confirmed bool) (*appsv1.Deployment, string, error) {
	// An lb pod of this Service left elsewhere (--lb-pod-namespace changed) holds the same address:
	// it goes first, and the new one comes only once its pods are gone.
	if moving, err := r.removeStray(ctx, svc); err != nil || moving {
		if err == nil {
			err = errStrayPods
		}
		return nil, "", err
	}
	d, foreign, _, err := r.ensureSet(ctx, svc, objects, r.confirmService(ctx, svc, confirmed), nil)
	return d, foreign, err
}

// ensureShared ensures the lb objects of each shared address of a Service that shares (sets, one
// per address), each as the objects of the address's owner (whose UID they carry), and deletes
// the Service's own objects of an earlier, unshared life. It returns the first address's
// Deployment, or the name of an object in the way. confirmed is as for ensureObjects.
//
// Only an object in the way in svc's own namespace (or the lb pod namespace) refuses svc. The
// RoleBindings of an address in the other members' namespaces are theirs to keep: one that is not
// ours there (its namespace's admin replaced it) is left alone and told in a Warning on svc, and
// that member's own pass is refused for it. Refusing every member for it would let the admin of
// one namespace take a shared address from the tenants of the others.
func (r *ServiceReconciler) ensureShared(ctx context.Context, svc *corev1.Service, sets []lbobjects.Set, confirmed bool) (*appsv1.Deployment, string, error) {
	// Its own objects of an unshared life ask for that life's address, which stays the Service's
	// (bound, then draining until no Deployment asks for it): only while it owns one may the cache
	// lag behind a create of ours whose echo woke nothing, and only then is the API server asked.
	// Otherwise the cache shows any such object, and every pass of a member would cost a GET per
	// name (4) for objects a member never has.
	unshared := slices.ContainsFunc(r.Book.OwnedBy(svc.UID), func(o decide.OwnedIP) bool { return o.SharingKey == "" && o.Conflict == nil })
	if err := r.deleteObjects(ctx, svc, unshared); err != nil {
		return nil, "", err
	}
	confirm := r.confirmService(ctx, svc, confirmed)
	var first *appsv1.Deployment
	for _, set := range sets {
		// The address's lb pods left elsewhere (--lb-pod-namespace changed) hold it too: they go
		// first, and the new ones come only once their pods are gone, as for a Service's own.
		if moving, err := r.removeSharedStray(ctx, set); err != nil || moving {
			if err == nil {
				err = errStrayPods
			}
			return nil, "", err
		}
		owner := &corev1.Service{}
		owner.Namespace, owner.Name = set.RoleBinding.Namespace, set.Deployment.Name
		owner.UID = types.UID(set.Deployment.Labels[lbv1.ServiceUIDLabel])
		elsewhere := func(o client.Object) bool {
			_, binding := o.(*rbacv1.RoleBinding)
			return binding && o.GetNamespace() != svc.Namespace && o.GetNamespace() != r.Options.LBPodNamespace
		}
		d, foreign, skipped, err := r.ensureSet(ctx, owner, set, confirm, elsewhere)
		if err != nil || foreign != "" {
			return nil, foreign, err
		}
		for _, what := range skipped {
			r.Recorder.Eventf(svc, nil, corev1.EventTypeWarning, decide.ReasonObjectConflict, actionApply, "%s",
				decide.BoundedMessage(fmt.Sprintf("%s of the shared address %s is not ours: left alone; the address's lb pods cannot read the members of that namespace until it is", what, set.Deployment.Labels[lbv1.SharedIPLabel])))
		}
		if err := r.dropMemberBindings(ctx, owner, set); err != nil {
			return nil, "", err
		}
		if first == nil {
			first = d
		}
	}
	if first == nil {
		first = &appsv1.Deployment{}
	}
	return first, "", nil
}

// dropMemberBindings deletes the RoleBindings of a shared address's lb pods in namespaces that
// no longer have a member (set is what they should be now).
func (r *ServiceReconciler) dropMemberBindings(ctx context.Context, owner *corev1.Service, set lbobjects.Set) error {
	want := map[string]bool{set.RoleBinding.Namespace: true}
	for _, rb := range set.MemberRoleBindings {
		want[rb.Namespace] = true
	}
	var rbs rbacv1.RoleBindingList
	if err := r.Client.List(ctx, &rbs, client.MatchingLabels{lbv1.SharedIPLabel: set.Deployment.Labels[lbv1.SharedIPLabel]}); err != nil {
		return fmt.Errorf("list the RoleBindings of %s: %w", set.Deployment.Name, err)
	}
	for i := range rbs.Items {
		if rb := &rbs.Items[i]; !want[rb.Namespace] && rb.Name == set.Deployment.Name {
			if err := r.deleteOwned(ctx, owner, rb, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// confirmService is the check, once per pass whatever it answers, that svc still lives on the
// API server (see ensure); the objects of a stage call it in parallel. A pass whose own write of
// the Service was accepted (confirmed) needs no read: that write was optimistically locked, so it
// went to the live Service, and the answer carried our finalizer and no deletion, so the Service
// cannot be gone before a pass of its deletion, which deletes what this one creates (for a new
// Service, that write is the one that adds the address: one read fewer per Service created).
func (r *ServiceReconciler) confirmService(ctx context.Context, svc *corev1.Service, confirmed bool) func() error {
	if confirmed {
		return func() error { return nil }
	}
	return sync.OnceValue(func() error {
		live := &corev1.Service{}
		err := r.Reader.Get(ctx, client.ObjectKeyFromObject(svc), live)
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("get service %s/%s: %w", svc.Namespace, svc.Name, err)
		}
		if err != nil || live.UID != svc.UID || !live.DeletionTimestamp.IsZero() {
			return errServiceGone
		}
		return nil
	})
}

// ensureSet makes one Set of objects what it says, stage by stage (Set.Stages, each stage's
// objects in parallel), and deletes those it leaves out; owner is whose the objects are
// (ownedBy). It returns the Deployment as ensured, or the name of an object in the way.
func (r *ServiceReconciler) ensureSet(ctx context.Context, owner *corev1.Service, objects lbobjects.Set, confirm func() error,
	tolerated func(client.Object) bool) (d *appsv1.Deployment, foreign string, skipped []string, err error) {
	cur := &appsv1.Deployment{}
	// The key first: the lb pods cannot start without it (the kubelet waits for the Secret).
	if err := r.ensureHAKey(ctx, owner, objects.HAKeySecret, confirm); err != nil {
		return nil, "", nil, err
	}
	for _, stage := range objects.Stages() {
		jobs := make([]ensureJob, len(stage))
		for i, o := range stage {
			jobs[i] = ensureJob{desired: o, cur: reflect.New(reflect.TypeOf(o).Elem()).Interface().(client.Object), tolerated: tolerated != nil && tolerated(o)}
			if o == lbobjects.Object(objects.Deployment) {
				jobs[i].cur = cur
			}
		}
		foreign, skippedHere, err := r.ensureAll(ctx, owner, jobs, confirm)
		if err != nil || foreign != "" {
			return nil, foreign, nil, err
		}
		skipped = append(skipped, skippedHere...)
	}
	for _, o := range objects.Unwanted() {
		if err := r.deleteOwned(ctx, owner, o, false); err != nil {
			return nil, "", nil, err
		}
	}
	if err := r.retire(ctx, owner, objects, cur); err != nil {
		return nil, "", nil, err
	}
	if cur.Name == "" {
		return objects.Deployment, "", skipped, nil
	}
	return cur, "", skipped, nil
}

// retire deletes the Service's own ServiceAccount and RoleBinding of an earlier release once its
// Deployment, as read before this pass wrote it (cur), already had the template that runs the
// lb pods under the namespace's shared identity and had rolled out: until then, lb pods under
// the old ServiceAccount still need its rights.
func (r *ServiceReconciler) retire(ctx context.Context, owner *corev1.Service, objects lbobjects.Set, cur *appsv1.Deployment) error {
	if len(objects.Retired) == 0 || cur.Name == "" || !lbobjects.RolledOut(cur) {
		return nil
	}
	current, err := r.upToDate(ctx, objects.Deployment, cur)
	if err != nil || !current {
		return err
	}
	for _, o := range objects.Retired {
		if err := r.deleteOwned(ctx, owner, o, false); err != nil {
			return err
		}
	}
	return nil
}

// errServiceGone: the API server no longer has the Service this pass read from the cache.
var errServiceGone = errors.New("the service is gone or being deleted")

// ensureJob is one object for ensure: what it should be, and where to read what it is.
// ensureJob is one object to ensure; tolerated says that one in the way that is not ours is left
// alone and skipped rather than stopping the pass.
type ensureJob struct {
	desired, cur client.Object
	tolerated    bool
}

// ensureAll ensures the jobs in parallel. It returns the first object in the order of jobs that is
// not ours and not tolerated, else the first error in that order, and the tolerated ones skipped.
func (r *ServiceReconciler) ensureAll(ctx context.Context, svc *corev1.Service, jobs []ensureJob, confirm func() error) (string, []string, error) {
	foreign := make([]string, len(jobs))
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Go(func() { foreign[i], errs[i] = r.ensure(ctx, svc, j.desired, j.cur, confirm) })
	}
	wg.Wait()
	var skipped []string
	for i, f := range foreign {
		switch {
		case f == "":
		case jobs[i].tolerated:
			skipped = append(skipped, f)
		default:
			return f, nil, nil
		}
	}
	for _, err := range errs {
		if err != nil {
			return "", nil, err
		}
	}
	return "", skipped, nil
}

// ensure creates desired, or server-side applies it (field manager lbsvc-operator, forced, so
// hand edits to the fields we own are reverted) when the current object differs from it. An
// object of that name that is not ours is left alone and its name returned. Before it creates
// anything, confirm must say that the Service still lives: a pass whose Service writes were all
// no-ops may have read a Service the cache still shows after its deletion, and a Deployment
// created then would never be deleted by us (no pass comes back for a gone Service) and would
// hold its address draining for ever where no garbage collector runs.
func (r *ServiceReconciler) ensure(ctx context.Context, svc *corev1.Service, desired, cur client.Object, confirm func() error) (string, error) {
	key := client.ObjectKeyFromObject(desired)
	what := fmt.Sprintf("%s %s/%s", lbobjects.KindOf(desired), key.Namespace, key.Name)
	err := r.Client.Get(ctx, key, cur)
	switch {
	case apierrors.IsNotFound(err):
		// Not in our (label-selected) cache: create it; if that name is taken, see by whom.
		if err := confirm(); err != nil {
			return "", err
		}
		create := desired.DeepCopyObject().(client.Object)
		err = r.Client.Create(ctx, create, client.FieldOwner(FieldOwner))
		if err == nil {
			r.rememberSpec(desired, create)
			return "", nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("create %s: %w", what, err)
		}
		if err := r.Reader.Get(ctx, key, cur); err != nil {
			return "", fmt.Errorf("get %s: %w", what, err)
		}
		if !ownedBy(cur, svc) {
			return what, nil
		}
		desired = fromSingle(desired, cur)
		if lbobjects.UpToDate(desired, cur) {
			r.rememberSpec(desired, cur)
			return "", nil // ours, and our cache had not seen it yet
		}
	case err != nil:
		return "", fmt.Errorf("get %s: %w", what, err)
	case !ownedBy(cur, svc):
		return what, nil
	default:
		desired = fromSingle(desired, cur)
		current, err := r.upToDate(ctx, desired, cur)
		if err != nil {
			return "", fmt.Errorf("%s: %w", what, err)
		}
		if current {
			return "", nil
		}
	}
	if lbobjects.RoleRefChanged(desired, cur) {
		return "", r.replaceBinding(ctx, desired, cur, what)
	}
	// A pod template changed by hand is replaced first, with the desired strategy in the same
	// write: the admission policy lbsvc-operator-writes refuses any change to a Deployment whose
	// result is not an lb pod's, so a merge patch of the strategy or annotations would be
	// refused while the hand-made template (another capability, the host network) is there.
	replaced := false
	if d, ok := desired.(*appsv1.Deployment); ok {
		if replaced, err = r.replaceForeignShape(ctx, d, cur); err != nil {
			return "", fmt.Errorf("%s: %w", what, err)
		}
	}
	if !replaced {
		if err := r.dropRollingUpdate(ctx, desired, cur); err != nil {
			return "", fmt.Errorf("%s: %w", what, err)
		}
	}
	if err := r.dropStaleAnnotations(ctx, desired, cur); err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(desired)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	obj := &unstructured.Unstructured{Object: u}
	unstructured.RemoveNestedField(obj.Object, "status")
	unstructured.RemoveNestedField(obj.Object, "metadata", "creationTimestamp")
	if err := r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return "", fmt.Errorf("apply %s: %w", what, err)
	}
	return "", nil
}

// fromSingle is lbobjects.FromSingle for a Deployment (any other object is returned as it is).
func fromSingle(desired, cur client.Object) client.Object {
	d, ok := desired.(*appsv1.Deployment)
	c, ok2 := cur.(*appsv1.Deployment)
	if !ok || !ok2 {
		return desired
	}
	return lbobjects.FromSingle(d, c)
}

// replaceBinding deletes cur, a RoleBinding of ours whose roleRef is not the desired one (the API
// server refuses to change a roleRef), and creates desired in its place. The delete is
// conditional on cur's UID, so a binding someone replaced meanwhile is left to the next pass. The
// lb pods lack their rights only between the two calls; their watches retry.
func (r *ServiceReconciler) replaceBinding(ctx context.Context, desired, cur client.Object, what string) error {
	if err := r.Client.Delete(ctx, cur, client.Preconditions{UID: ptrUID(cur.GetUID())}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %s to change its roleRef: %w", what, err)
	}
	if err := r.Client.Create(ctx, desired.DeepCopyObject().(client.Object), client.FieldOwner(FieldOwner)); err != nil {
		return fmt.Errorf("create %s with its new roleRef: %w", what, err)
	}
	return nil
}

// rememberSpec notes, for a Deployment, that live (a full object from the API server: our
// create's answer or a read) matches desired, when it does.
func (r *ServiceReconciler) rememberSpec(desired, live client.Object) {
	d, ok := desired.(*appsv1.Deployment)
	l, _ := live.(*appsv1.Deployment)
	if !ok || l == nil || r.specs == nil || lbobjects.TemplateTrimmed(l) || !lbobjects.UpToDate(d, l) {
		return
	}
	r.specs.remember(client.ObjectKeyFromObject(l), lbobjects.SpecDigest(&d.Spec), lbobjects.SpecDigest(&l.Spec))
}

// dropRollingUpdate clears strategy.rollingUpdate before a Deployment goes back to Recreate (its
// Service back to one lb pod): the API server refuses Recreate with rollingUpdate set, and a server-
// side apply that omits the field does not remove it when the object was created, not applied.
func (r *ServiceReconciler) dropRollingUpdate(ctx context.Context, desired, cur client.Object) error {
	d, ok := desired.(*appsv1.Deployment)
	if !ok || d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		return nil
	}
	c, ok := cur.(*appsv1.Deployment)
	if !ok || c.Name == "" || c.Spec.Strategy.RollingUpdate == nil {
		return nil
	}
	patch := []byte(`{"spec":{"strategy":{"type":"Recreate","rollingUpdate":null}}}`)
	if err := r.Client.Patch(ctx, c, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(FieldOwner)); err != nil {
		return fmt.Errorf("clear rollingUpdate: %w", err)
	}
	return nil
}

// dropStaleAnnotations removes from cur, the live object, each of lbobjects.ExactAnnotations that
// desired no longer carries (a shared address's ServiceAccount once its last member of another
// namespace left). Server-side apply removes only fields its own manager set: an object created
// with Create has them under another manager, and an apply without them would leave them there,
// never up to date, applied again at every pass.
func (r *ServiceReconciler) dropStaleAnnotations(ctx context.Context, desired, cur client.Object) error {
	stale := map[string]any{}
	for _, k := range lbobjects.ExactAnnotations {
		if _, want := desired.GetAnnotations()[k]; !want {
			if _, has := cur.GetAnnotations()[k]; has {
				stale[k] = nil
			}
		}
	}
	if len(stale) == 0 || cur.GetName() == "" {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": stale}})
	if err != nil {
		return err
	}
	if err := r.Client.Patch(ctx, cur, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(FieldOwner)); err != nil {
		return fmt.Errorf("remove annotations no longer wanted: %w", err)
	}
	return nil
}

// replaceForeignShape puts the desired pod template in place whole when the live one has
// something added that is not ours (see samePodShape: a capability, a variable, a container, a
// volume, host networking): server-side apply removes only the fields its manager owns, so an
// addition made by hand would survive every apply. A JSON patch replaces the template, after a
// test of the live resourceVersion (a conflict is retried by the next pass): the `patch` verb
// the operator has, no `update`. The desired strategy goes in the same write (a rollout from
// one lb pod, or to a new key, must not go as a RollingUpdate). cur is the live Deployment when
// it was read in full already (upToDate's read, or the one after a create found the name
// taken); else it is read here. It says whether it replaced the template.
func (r *ServiceReconciler) replaceForeignShape(ctx context.Context, desired *appsv1.Deployment, cur client.Object) (bool, error) {
	live, _ := cur.(*appsv1.Deployment)
	if live == nil || live.ResourceVersion == "" || lbobjects.TemplateTrimmed(live) {
		live = &appsv1.Deployment{}
		if err := r.Reader.Get(ctx, client.ObjectKeyFromObject(desired), live); err != nil {
			return false, client.IgnoreNotFound(err)
		}
	}
	if lbobjects.SamePodShape(&desired.Spec.Template.Spec, &live.Spec.Template.Spec) {
		return false, nil
	}
	patch, err := json.Marshal([]map[string]any{
		{"op": "test", "path": "/metadata/resourceVersion", "value": live.ResourceVersion},
		{"op": "replace", "path": "/spec/template", "value": desired.Spec.Template},
		{"op": "replace", "path": "/spec/strategy", "value": desired.Spec.Strategy},
	})
	if err != nil {
		return false, err
	}
	if err := r.Client.Patch(ctx, live, client.RawPatch(types.JSONPatchType, patch), client.FieldOwner(FieldOwner)); err != nil {
		return false, fmt.Errorf("replace the pod template: %w", err)
	}
	return true, nil
}

// deleteObjects deletes our per-Service objects (those that carry our owner reference, labels or
// annotation); askAPI is deleteOwned's.
// Background propagation: the name is free at once for a Service created again, and the drain of
// the addresses waits for the ReplicaSets and pods the garbage collector removes after it.
func (r *ServiceReconciler) deleteObjects(ctx context.Context, svc *corev1.Service, askAPI bool) error {
	for _, obj := range lbobjects.At(r.Options.LBPodNamespace, svc.Namespace, svc.Name) {
		if err := r.deleteOwned(ctx, svc, obj, askAPI); err != nil {
			return err
		}
	}
	return nil
}

// deleteOwned deletes obj (named, empty) if it is svc's. With askAPI, an object our cache does
// not show is looked up on the API server too: the cache may not show yet what the previous pass
// created a moment ago, and once the Service is let go no pass comes back for it (a Deployment
// missed here would ask for its address for ever: the drain waits for it).
func (r *ServiceReconciler) deleteOwned(ctx context.Context, svc *corev1.Service, obj client.Object, askAPI bool) error {
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	if apierrors.IsNotFound(err) && askAPI {
		err = r.Reader.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	}
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get %s %s/%s: %w", lbobjects.KindOf(obj), obj.GetNamespace(), obj.GetName(), err)
	}
	if !ownedBy(obj, svc) || !obj.GetDeletionTimestamp().IsZero() {
		return nil
	}
	if _, ok := obj.(*appsv1.Deployment); ok && r.specs != nil {
		r.specs.forget(client.ObjectKeyFromObject(obj))
	}
	if err := r.Client.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground),
		client.Preconditions{UID: ptrUID(obj.GetUID())}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %s %s/%s: %w", lbobjects.KindOf(obj), obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

func ptrUID(u types.UID) *types.UID { return &u }

// ownedBy tells whether obj was built by us for svc: the owner reference, the UID label or the
// UID annotation (any one survives a hand edit of the others), or the shared lb pod identity of
// svc's namespace.
func ownedBy(obj client.Object, svc *corev1.Service) bool {
	if metav1.IsControlledBy(obj, svc) {
		return true
	}
	if lbobjects.IsIdentity(obj) {
		// The namespace's shared lb pod identity serves every Service there (never deleted as
		// one Service's: it is at none of their names, lbobjects.At).
		return obj.GetLabels()[lbv1.ServiceNamespaceLabel] == svc.Namespace
	}
	uid := string(svc.UID)
	return obj.GetLabels()[lbv1.ServiceUIDLabel] == uid || obj.GetAnnotations()[lbobjects.ServiceUIDAnnotation] == uid
}

// foreignObject names an object at one of the Service's per-Service names that is not ours.
func (r *ServiceReconciler) foreignObject(ctx context.Context, svc *corev1.Service) (string, error) {
	for _, o := range lbobjects.At(r.Options.LBPodNamespace, svc.Namespace, svc.Name) {
		err := r.Reader.Get(ctx, client.ObjectKeyFromObject(o), o)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("get %T %s/%s: %w", o, o.GetNamespace(), o.GetName(), err)
		}
		if !ownedBy(o, svc) {
			return fmt.Sprintf("%s %s/%s", lbobjects.KindOf(o), o.GetNamespace(), o.GetName()), nil
		}
	}
	return "", nil
}

// errStrayPods: the Service's lb pods still run where they no longer belong; the pass looks again
// after drainRecheck (the Service controller does not watch pods, so their end wakes nothing).
var errStrayPods = errors.New("waiting for the lb pods left in the previous lb pod namespace to be gone")

// removeStray deletes our Deployments and ServiceAccounts of svc that are not where they belong
// now, and tells whether pods of svc still run outside the lb pod namespace. Only objects
// provably svc's count (decide.StrayOurs: namespaces its IP objects trust): a tenant's object
// elsewhere with svc's UID label is neither deleted nor waited for, so it cannot freeze the pass.
func (r *ServiceReconciler) removeStray(ctx context.Context, svc *corev1.Service) (bool, error) {
	mine := client.MatchingFields{indexServiceUID: string(svc.UID)}
	podNS, name := lbobjects.PodNamespace(r.Options.LBPodNamespace, svc.Namespace), lbobjects.ObjectNameIn(r.Options.LBPodNamespace, svc.Namespace, svc.Name)
	var ips []*lbv1.IP
	for _, o := range r.Book.OwnedBy(svc.UID) {
		ip := &lbv1.IP{}
		if err := r.Client.Get(ctx, client.ObjectKey{Name: o.Name}, ip); err != nil {
			if apierrors.IsNotFound(err) {
				continue // a claim of this pass the cache has not shown yet: no lb pod had it
			}
			return false, err
		}
		ips = append(ips, ip)
	}
	// The lb objects of a shared address carry its owner's UID too, but are the address's, not
	// the owner's: they go when the address drains (IPReconciler), never as strays of a member.
	ours := func(o metav1.Object) bool {
		return o.GetLabels()[lbv1.SharedIPLabel] == "" && decide.StrayOurs(o, ips, r.Options.LBPodNamespace)
	}
	return r.removeStrayObjects(ctx, mine,
		func(o metav1.Object) bool { return (o.GetNamespace() != podNS || o.GetName() != name) && ours(o) },
		func(p *corev1.Pod) bool { return p.Namespace != podNS && ours(p) })
}

// removeSharedStray is removeStray for the lb objects of a shared address (set: as they should be
// now): its Deployment and ServiceAccount outside the namespace they belong in now, provably the
// address's (decide.ProvablyOurs: our labels, its owner's UID, a namespace its IP object trusts),
// are deleted, and it tells whether its pods still run there.
func (r *ServiceReconciler) removeSharedStray(ctx context.Context, set lbobjects.Set) (bool, error) {
	name, podNS := set.Deployment.Labels[lbv1.SharedIPLabel], set.Deployment.Namespace
	ip := &lbv1.IP{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, ip); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	// Only in a namespace the IP object trusts (the lb pod namespace, and one status.holders
	// lists): not the owner's own, as decide.StrayOurs allows for a Service's own objects. These
	// serve every member, and a pod forged there by the owner namespace's tenant would otherwise
	// hold back the address's objects, and so every other namespace's members, for ever.
	trusted := func(o metav1.Object) bool {
		return o.GetNamespace() != podNS && o.GetLabels()[lbv1.SharedIPLabel] == name && decide.ProvablyOurs(o, ip, r.Options.LBPodNamespace)
	}
	// By the owner's UID (indexed): the address's objects carry it.
	return r.removeStrayObjects(ctx, client.MatchingFields{indexServiceUID: ip.Spec.Service.UID},
		func(o metav1.Object) bool { return o.GetName() == set.Deployment.Name && trusted(o) },
		func(p *corev1.Pod) bool { return trusted(p) })
}

// removeStrayObjects deletes the Deployments and ServiceAccounts listed by found that stray says
// are left behind, and tells whether a pod listed by found that runs says is still there.
func (r *ServiceReconciler) removeStrayObjects(ctx context.Context, found client.ListOption, stray func(metav1.Object) bool, runs func(*corev1.Pod) bool) (bool, error) {
	var deps appsv1.DeploymentList
	if err := r.Client.List(ctx, &deps, found); err != nil {
		return false, err
	}
	var sas corev1.ServiceAccountList
	if err := r.Client.List(ctx, &sas, found); err != nil {
		return false, err
	}
	var left []client.Object
	for i := range deps.Items {
		if stray(&deps.Items[i]) {
			left = append(left, &deps.Items[i])
		}
	}
	for i := range sas.Items {
		if stray(&sas.Items[i]) {
			left = append(left, &sas.Items[i])
		}
	}
	if err := r.deleteStray(ctx, left); err != nil {
		return false, err
	}
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, found); err != nil {
		return false, err
	}
	return slices.ContainsFunc(pods.Items, func(p corev1.Pod) bool { return runs(&p) }), nil
}

// deleteStray deletes the objects removeStray or removeSharedStray found left behind, each of
// the version judged (a UID precondition).
func (r *ServiceReconciler) deleteStray(ctx context.Context, stray []client.Object) error {
	for _, o := range stray {
		if !o.GetDeletionTimestamp().IsZero() {
			continue
		}
		if _, ok := o.(*appsv1.Deployment); ok && r.specs != nil {
			r.specs.forget(client.ObjectKeyFromObject(o))
		}
		// Of the version judged ours (read from the cache): an object created since at that name
		// is another one, for the next pass to judge.
		err := r.Client.Delete(ctx, o, client.PropagationPolicy(metav1.DeletePropagationBackground), client.Preconditions{UID: ptrUID(o.GetUID())})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("delete %s %s/%s left from a previous lb pod namespace: %w", lbobjects.KindOf(o), o.GetNamespace(), o.GetName(), err)
		}
	}
	return nil
}

// upToDate is upToDate for a cached object. A Deployment comes from the cache without its
// template: when its live spec is one already seen to match the desired spec, it is up to date;
// else it is read from the API server and compared in full (once per Deployment and change), and
// cur becomes that full object, so that what follows needs no second read.
func (r *ServiceReconciler) upToDate(ctx context.Context, desired, cur client.Object) (bool, error) {
	d, ok := desired.(*appsv1.Deployment)
	c, _ := cur.(*appsv1.Deployment)
	if !ok || c == nil || !lbobjects.TemplateTrimmed(c) {
		return lbobjects.UpToDate(desired, cur), nil
	}
	rest := d.DeepCopy()
	rest.Spec.Template = corev1.PodTemplateSpec{}
	if !lbobjects.UpToDate(rest, c) {
		return false, nil // metadata, owner, replicas, strategy or selector differ: no need to look further
	}
	key := client.ObjectKeyFromObject(c)
	if r.specs.matches(key, lbobjects.SpecDigest(&d.Spec), lbobjects.LiveSpecDigest(c)) {
		return true, nil
	}
	full := &appsv1.Deployment{}
	if err := r.Reader.Get(ctx, key, full); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("get: %w", err)
	}
	full.DeepCopyInto(c)
	if !lbobjects.UpToDate(desired, c) {
		return false, nil
	}
	r.rememberSpec(desired, c)
	return true, nil
}

// The cache keeps our Deployments without their pod template: the template was 8 of the 33 MiB
// live heap with 1000 Services (make bench-operator, heap.pprof), the largest single part, and the
// operator reads it only to tell whether the Deployment still matches what it wants. In its place
// the cached object carries a digest of the whole live spec (lbobjects.CachedSpecDigestKey in the otherwise
// empty template's annotations), and the reconciler remembers, per Deployment, which live spec it
// has seen match which desired spec (specDigests). A pass whose desired spec and live spec are
// both the ones remembered writes nothing without reading the template; any other pass reads the
// Deployment from the API server once and compares in full, as before. A hand edit of any spec
// field, a removal included, changes the live spec and so its digest: it is reverted as before.

// specDigests remembers, per Deployment, the desired spec and the live spec that were found to
// match (or that our own create produced). It is memory only: after a restart each Deployment is
// read once from the API server and compared in full.
type specDigests struct {
	mu   sync.Mutex
	seen map[types.NamespacedName]specMatch
}

type specMatch struct{ desired, live string }

func newSpecDigests() *specDigests {
	return &specDigests{seen: map[types.NamespacedName]specMatch{}}
}

// matches tells whether the live spec was seen to match the desired spec.
func (s *specDigests) matches(key types.NamespacedName, desired, live string) bool {
	if desired == "" || live == "" {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.seen[key]
	return ok && m.desired == desired && m.live == live
}

// remember notes that the live spec matches the desired spec.
func (s *specDigests) remember(key types.NamespacedName, desired, live string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen[key] = specMatch{desired: desired, live: live}
}

// forget drops what is remembered of a Deployment that goes.
func (s *specDigests) forget(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.seen, key)
}
