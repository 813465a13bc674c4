package controllers

import (
	"fmt"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"

	lbv1 "github.com/lbsvc/lbsvc-operator/apis/v1alpha1"
)

// NewScheme returns a scheme with the built-in types, Subnets and NetworkAttachmentDefinitions.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, lbv1.AddToScheme, nadv1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("build scheme: %w", err)
		}
	}
	return s, nil
}

// Setup adds the address book and the Subnet, IP and Service reconcilers to mgr. With
// opts.EnableLBSvc off the Service reconciler only lets go of Services we served that are being
// deleted (finalizer removed, addresses drained); nothing else is created, changed or deleted.
func Setup(mgr ctrl.Manager, opts Options) error {
	log := ctrl.Log.WithName("setup")
	// The Service reconciler and its claims write through a client that remembers the versions
	// they wrote, so that the echo of each write does not wake the Service again.
	own := newOwnWrites()
	writer := recordingClient{Client: mgr.GetClient(), own: own}
	book := NewAddressBook(mgr.GetCache(), mgr.GetAPIReader(), writer)
	book.DefaultProvider = opts.DefaultAttachmentProvider
	if err := mgr.Add(book); err != nil {
		return fmt.Errorf("add address book: %w", err)
	}
	servicesByCondition.use(mgr.GetCache())
	if err := (&SubnetReconciler{
		Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder(FieldOwner), Book: book,
		SkipNameValidation: opts.SkipNameValidation,
	}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up subnet controller: %w", err)
	}
	if err := (&IPReconciler{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder(FieldOwner),
		LBPodNamespace: opts.LBPodNamespace, LBReplicas: opts.LBReplicas, SkipNameValidation: opts.SkipNameValidation,
	}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up ip controller: %w", err)
	}
	if !opts.EnableLBSvc {
		// An upgrade that forgets the flag must not tear down live Services.
		log.Info("--enable-lb-svc is false: LoadBalancer Services are not served; only the deletion of Services served before completes")
	}
	if opts.MaxConcurrentReconciles < 1 {
		opts.MaxConcurrentReconciles = 1
	}
	if err := (&ServiceReconciler{
		Client: writer, Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder(FieldOwner), Book: book, Options: opts, own: own,
	}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up service controller: %w", err)
	}
	if opts.EnableLBSvc {
		if err := (&ActiveReconciler{
			Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder(FieldOwner), LBPodNamespace: opts.LBPodNamespace,
			LBReplicas: opts.LBReplicas, SkipNameValidation: opts.SkipNameValidation,
		}).SetupWithManager(mgr); err != nil {
			return fmt.Errorf("set up active-holder controller: %w", err)
		}
	}
	log.Info("service controller set up", "enableLBSvc", opts.EnableLBSvc, "image", opts.LBSvcImage,
		"defaultAttachmentProvider", opts.DefaultAttachmentProvider, "forwardingSysctls", opts.ForwardingSysctls,
		"lbPodNamespace", opts.LBPodNamespace, "maxConcurrentReconciles", opts.MaxConcurrentReconciles)
	return nil
}
